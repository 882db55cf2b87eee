"""The retrieval service: FastAPI app speaking the Search-R1 /retrieve contract (retrieval/schemas.py).

Run it with `searchrl serve` (or `make serve-retrieval`). `create_app(settings)` builds nothing at import time:
the backend is built and loaded in the lifespan, so tests and the CLI pass their own settings.

Routes:
    POST /retrieve   Search-R1 batch body or SkyRL single-query body -> {"result": [[...], ...]}
    GET  /health     liveness only, no work, never needs auth (load balancers and probes poll it)
    GET  /           JSON description: backend, corpus size, index type, encoder, version
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from retrieval.backends import build_backend
from retrieval.backends.base import Backend
from retrieval.schemas import RetrieveRequest, hits_to_payload
from retrieval.settings import RetrievalSettings
from searchrl import __version__
from searchrl.errors import (
    BackendError,
    OverloadedError,
    QuotaExceededError,
    SearchRLError,
)

log = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health"})


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


def create_app(settings: RetrievalSettings, backend: Backend | None = None) -> FastAPI:
    """Build the app; `backend` may be passed in (tests), otherwise `settings.backend` names it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        be = backend or build_backend(settings)
        await be.start()
        app.state.backend = be
        log.info("retrieval service ready: %s", be.info())
        try:
            yield
        finally:
            await be.close()

    app = FastAPI(title="searchrl retrieval", version=__version__, lifespan=lifespan)
    api_key = settings.api_key_value()

    @app.middleware("http")
    async def bearer_auth(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if api_key is None or request.url.path in _OPEN_PATHS:
            return await call_next(request)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # compare_digest: the time taken must not reveal how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            reason = "missing Authorization header" if not header else "invalid bearer token"
            return _error(
                401,
                f"{reason}: send 'Authorization: Bearer <RETRIEVAL_API_KEY>'",
                {"WWW-Authenticate": "Bearer"},
            )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = _describe_validation_error(exc)
        return _error(status, detail)

    @app.exception_handler(OverloadedError)
    async def on_overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
        return _error(503, str(exc), {"Retry-After": str(max(1, round(exc.retry_after)))})

    @app.exception_handler(QuotaExceededError)
    async def on_quota(request: Request, exc: QuotaExceededError) -> JSONResponse:
        return _error(429, str(exc))

    @app.exception_handler(BackendError)
    async def on_backend_error(request: Request, exc: BackendError) -> JSONResponse:
        log.warning("backend error: %s", exc)
        return _error(502, f"backend {settings.backend} failed: {exc}")

    @app.exception_handler(SearchRLError)
    async def on_searchrl_error(request: Request, exc: SearchRLError) -> JSONResponse:
        log.warning("request failed: %s", exc)
        return _error(500, str(exc))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return _error(500, "internal error (see server log)")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

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
        queries = body.query_list
        topk = body.topk if body.topk is not None else settings.topk
        if topk > settings.max_topk:
            return _error(422, f"topk: {topk} is above this server's maximum of {settings.max_topk}")
        if len(queries) > settings.max_queries:
            return _error(
                422,
                f"queries: {len(queries)} queries in one request; this server takes at most {settings.max_queries}",
            )
        for i, q in enumerate(queries):
            if len(q) > settings.max_query_chars:
                return _error(
                    422, f"queries.{i}: {len(q)} characters; the maximum is {settings.max_query_chars}"
                )
            if not q.strip():
                return _error(422, f"queries.{i}: empty query string")
        be: Backend = request.app.state.backend
        hits = await be.search(queries, topk)
        return JSONResponse(hits_to_payload(hits, return_scores=body.return_scores))

    return app


__all__ = ["create_app"]
