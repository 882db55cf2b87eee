"""POST /retrieve as a plain ASGI handler: the service's hot path (issue 14).

Why not only a FastAPI route: under RL rollouts the service answers hundreds of one-query requests per second
on the same cores as the query encoder, so every microsecond of per-request Python is taken from the encoder.
A FastAPI route runs Starlette's routing, FastAPI's dependency solving, a `Request` object, the
exception-handler lookup and `json.dumps` of a dict built with `model_dump` for every hit. This handler does
the same work in a few calls: pydantic-core validates the body with the app's own request model (so every
400/422 sentence is the one `describe_errors` writes, as before), the backend searches, and pydantic-core
renders the hits straight to JSON bytes. Errors map to statuses in one place, `error_answer`, which the app's
exception handlers use too. `docs/sizing.md` has the CPU per request before and after.

The app (retrieval/serving/app.py, `RetrievalAPI`) sends POST /retrieve through `BearerAuth` and `RequestGuard` (body
size and deadline, draining) to this handler before FastAPI's own middleware and router, so every limit and the
token check apply unchanged; anything else goes to FastAPI (a `GET /retrieve` still gets FastAPI's 405). The
FastAPI route stays for the OpenAPI schema and answers through the same `respond`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from searchrl.errors import (
    BackendError,
    CacheMissError,
    OverloadedError,
    QuotaExceededError,
    SearchRLError,
)
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import Document, RetrieveRequest, ScoredDocument
from searchrl.retrieval.serving.metrics import RetrievalMetrics
from searchrl.retrieval.serving.ratelog import RateLimitedLog
from searchrl.retrieval.serving.validation import describe_errors
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger("searchrl.retrieval.serving.app")  # the app's logger: operators filter on one name
_ratelog = RateLimitedLog(log)

PARSE_INLINE_BYTES = 64 * 1024  # bigger bodies are parsed on a worker thread, so /health never stalls
JSON_HEADERS = [(b"content-type", b"application/json")]

# pydantic-core renders these straight to JSON bytes (compact, UTF-8 unescaped, as JSONResponse did)
_SCORED = TypeAdapter(list[list[ScoredDocument]])
_BARE = TypeAdapter(list[list[Document]])
_DETAIL = TypeAdapter(dict[str, str])

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, body, extra headers


def error_kind(exc: BaseException) -> tuple[int, str]:
    """HTTP status and metrics label for an exception escaping the backend (the one place that maps them)."""
    if isinstance(exc, OverloadedError):
        return 503, "overloaded"
    if isinstance(exc, QuotaExceededError):
        return 429, "quota"
    if isinstance(exc, CacheMissError):
        return 404, "cache_miss"  # replay mode: retrying cannot help, so not a 5xx the client would retry
    if isinstance(exc, BackendError):
        return 502, "backend"
    return 500, "internal"


def error_answer(exc: Exception, settings: RetrievalSettings, path: str) -> tuple[int, str, dict[str, str]]:
    """Status, `detail` sentence and headers for an exception a request raised; logs what an operator needs."""
    if not isinstance(exc, SearchRLError):
        log.error("unexpected error on %s", path, exc_info=exc)
        return 500, "internal error (see server log)", {}
    status, kind = error_kind(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, OverloadedError):
        retry_after = max(1, min(round(exc.retry_after), round(settings.retry_after_max_s)))
        headers["Retry-After"] = str(retry_after)
    if status >= 500:
        # aggregated: under overload every refusal is the same event (4,333 lines in 53 s before)
        _ratelog.warning(kind, "request failed (%s): %s", kind, exc)
    detail = f"backend {settings.backend} failed: {exc}" if kind == "backend" else str(exc)
    return status, detail, headers


def render_hits(hits: list[list[ScoredDocument]], *, return_scores: bool) -> bytes:
    """The 200 body: scored objects or bare documents (Search-R1's two shapes), as JSON bytes."""
    if return_scores:
        return b'{"result":' + _SCORED.dump_json(hits) + b"}"
    return b'{"result":' + _BARE.dump_json([[h.document for h in per_query] for per_query in hits]) + b"}"


def _detail(status: int, detail: str, headers: dict[str, str] | None = None) -> Answer:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    return status, _DETAIL.dump_json({"detail": detail}), extra


class RetrieveHandler:
    """Parse, search, render: what POST /retrieve does, whichever way the request arrives."""

    def __init__(
        self,
        *,
        settings: RetrievalSettings,
        metrics: RetrievalMetrics,
        state: Any,
        body_model: type[RetrieveRequest],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.state = state  # the app's state: backend, in_flight and answered counters
        self.body_model = body_model

    async def respond(self, raw: bytes) -> Answer:
        """Status, JSON body and extra headers for one /retrieve body (metrics counted here)."""
        started = time.perf_counter()
        settings, metrics = self.settings, self.metrics
        try:
            if len(raw) > PARSE_INLINE_BYTES:
                body = await asyncio.to_thread(self.body_model.model_validate_json, raw)
            else:
                body = self.body_model.model_validate_json(raw)
        except ValidationError as exc:
            status, detail = describe_errors(exc.errors(), settings)
            metrics.observe_request(status, 0, 0.0, "invalid")
            return _detail(status, detail)
        queries = body.query_list
        topk = body.topk if body.topk is not None else settings.topk
        backend: Backend = self.state.backend
        state = self.state
        state.in_flight += 1
        try:
            hits = await backend.search(queries, topk)
        except Exception as exc:  # answered here with the same statuses and sentences as the app's handlers
            status, kind = error_kind(exc)
            metrics.observe_request(status, len(queries), time.perf_counter() - started, kind)
            status, detail, headers = error_answer(exc, settings, "/retrieve")
            return _detail(status, detail, headers)
        finally:
            state.in_flight -= 1
        payload = render_hits(hits, return_scores=body.return_scores)
        metrics.observe_request(200, len(queries), time.perf_counter() - started)
        state.answered += 1
        return 200, payload, []


class RetrieveEndpoint:
    """ASGI app that answers POST /retrieve with `handler` (the app routes only that request here)."""

    def __init__(self, handler: RetrieveHandler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:  # RequestGuard hands over the whole body as one message; this loop covers any other way
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            status, body, headers = await self.handler.respond(
                chunks[0] if len(chunks) == 1 else b"".join(chunks)
            )
        except Exception as exc:  # a bug: the same 500 the app's catch-all gives, logged with its traceback
            status, detail, extra = error_answer(exc, self.handler.settings, "/retrieve")
            status, body, headers = _detail(status, detail, extra)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *JSON_HEADERS, *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})


__all__ = [
    "PARSE_INLINE_BYTES",
    "RetrieveEndpoint",
    "RetrieveHandler",
    "error_answer",
    "error_kind",
    "render_hits",
]
