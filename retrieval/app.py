"""The retrieval service: FastAPI app speaking the Search-R1 /retrieve contract (retrieval/schemas.py).

Run it with `searchrl serve` (or `make serve-retrieval`). `create_app(settings)` builds nothing at import time:
the backend is built and loaded in the lifespan, so tests and the CLI pass their own settings.

Routes:
    POST /retrieve   Search-R1 batch body or SkyRL single-query body -> {"result": [[...], ...]}
    GET  /health     liveness only, no work, never needs auth (load balancers and probes poll it)
    GET  /metrics    Prometheus text format (retrieval/metrics.py); needs the bearer token like /retrieve
    GET  /           JSON description: backend, corpus size, index type, encoder, version
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from retrieval.backends import build_backend
from retrieval.backends.base import Backend
from retrieval.metrics import CONTENT_TYPE, RetrievalMetrics
from retrieval.schemas import RetrieveRequest, hits_to_payload
from retrieval.settings import RetrievalSettings
from searchrl import __version__
from searchrl.errors import (
    BackendError,
    CacheMissError,
    OverloadedError,
    QuotaExceededError,
    SearchRLError,
)

log = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health"})


def _error_kind(exc: BaseException) -> tuple[int, str]:
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


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


def _describe_validation_error(exc: RequestValidationError) -> tuple[int, str]:
    """One readable sentence for the first problem in a request body (400 for bad JSON, else 422)."""
    errors = exc.errors()
    if not errors:
        return 422, "invalid request"
    err = errors[0]
    kind = err.get("type", "")
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    where = ".".join(loc)
    if kind == "json_invalid":
        return 400, f"request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
    if kind == "extra_forbidden":
        return 422, f"unknown field {where!r}; allowed: queries, query, topk, return_scores"
    if kind == "missing" and not loc:
        return 422, 'request body is empty: send {"queries": [...], "topk": 3}'
    if kind in {"model_attributes_type", "dict_type"}:
        return 422, 'request body must be a JSON object like {"queries": ["..."], "topk": 3}'
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return 422, f"{where}: {msg}" if where else msg


class BearerAuth:
    """Require `Authorization: Bearer <key>` on every path but /health.

    A plain ASGI middleware rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware wraps each
    request in extra tasks and streams, which measurably cuts requests/s under RL burst load (issue 4); and
    without an API key it is not installed at all.
    """

    def __init__(self, app: ASGIApp, *, api_key: str, metrics: RetrievalMetrics) -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        scheme, _, token = header.partition(" ")
        # compare_digest: the time taken must not reveal how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key):
            reason = "missing Authorization header" if not header else "invalid bearer token"
            if scope["path"] == "/retrieve":
                self.metrics.observe_request(401, 0, 0.0, "auth")
            response = _error(
                401,
                f"{reason}: send 'Authorization: Bearer <RETRIEVAL_API_KEY>'",
                {"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(settings: RetrievalSettings, backend: Backend | None = None) -> FastAPI:
    """Build the app; `backend` may be passed in (tests), otherwise `settings.backend` names it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        be = backend or build_backend(settings)
        # Backends that batch (dense) report batch sizes, queue depth and cache hits to this app's registry.
        attach = getattr(be, "attach_metrics", None)
        if callable(attach):
            attach(metrics)
        await be.start()
        app.state.backend = be
        log.info("retrieval service ready: %s", be.info())
        try:
            yield
        finally:
            await be.close()

    app = FastAPI(title="searchrl retrieval", version=__version__, lifespan=lifespan)
    api_key = settings.api_key_value()
    metrics = RetrievalMetrics()
    app.state.metrics = metrics

    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = _describe_validation_error(exc)
        if request.url.path == "/retrieve":
            metrics.observe_request(status, 0, 0.0, "invalid")
        return _error(status, detail)

    @app.exception_handler(SearchRLError)
    async def on_searchrl_error(request: Request, exc: SearchRLError) -> JSONResponse:
        status, kind = _error_kind(exc)
        headers = None
        if isinstance(exc, OverloadedError):
            headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
        if status >= 500:
            log.warning("request failed (%s): %s", kind, exc)
        detail = f"backend {settings.backend} failed: {exc}" if kind == "backend" else str(exc)
        return _error(status, detail, headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return _error(500, "internal error (see server log)")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/")
    async def describe(request: Request) -> dict[str, Any]:
        be: Backend = request.app.state.backend
        return {
            "service": "searchrl-retrieval",
            "version": __version__,
            **be.info(),
            "default_topk": settings.topk,
            "max_topk": settings.max_topk,
            "max_queries": settings.max_queries,
            "auth": api_key is not None,
        }

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest, request: Request) -> JSONResponse:
        started = time.perf_counter()
        queries = body.query_list
        topk = body.topk if body.topk is not None else settings.topk
        problem = _check_limits(queries, topk)
        if problem is not None:
            metrics.observe_request(422, len(queries), time.perf_counter() - started, "invalid")
            return _error(422, problem)
        be: Backend = request.app.state.backend
        try:
            hits = await be.search(queries, topk)
        except Exception as exc:  # counted here, answered by the exception handlers above
            status, kind = _error_kind(exc)
            metrics.observe_request(status, len(queries), time.perf_counter() - started, kind)
            raise
        response = JSONResponse(hits_to_payload(hits, return_scores=body.return_scores))
        metrics.observe_request(200, len(queries), time.perf_counter() - started)
        return response

    def _check_limits(queries: list[str], topk: int) -> str | None:
        """The first server-side limit a request breaks, as a 422 message, or None."""
        if topk > settings.max_topk:
            return f"topk: {topk} is above this server's maximum of {settings.max_topk}"
        if len(queries) > settings.max_queries:
            return f"queries: {len(queries)} queries in one request; this server takes at most {settings.max_queries}"
        for i, q in enumerate(queries):
            if len(q) > settings.max_query_chars:
                return f"queries.{i}: {len(q)} characters; the maximum is {settings.max_query_chars}"
            if not q.strip():
                return f"queries.{i}: empty query string"
        return None

    return app


__all__ = ["create_app"]
