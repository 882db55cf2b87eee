"""The retrieval service: FastAPI app speaking the Search-R1 /retrieve contract (retrieval/schemas.py).

Run it with `searchrl serve` (or `make serve-retrieval`). `create_app(settings)` builds nothing at import time:
the backend is built and loaded in the lifespan, so tests and the CLI pass their own settings.

Routes:
    POST /retrieve   Search-R1 batch body or SkyRL single-query body -> {"result": [[...], ...]}
    GET  /health     liveness only: the process answers; no work, never needs auth
    GET|POST /ready  readiness: index loaded and warmed by one query, batch worker alive and not stalled, not
                     draining (503 with the reason otherwise; a saturated queue is "busy", still 200); needs
                     the token when auth is on, so a probe also proves the replica's token matches the clients'
    GET  /metrics    Prometheus text format (retrieval/metrics.py); needs the bearer token like /retrieve
    GET  /           JSON description: backend, corpus size, index type, encoder, version

Limits (issue 13; every one is in the OpenAPI schema): body size (413, refused while reading, before the body
is buffered), body read deadline (408), queries/topk/query length as schema constraints (422), bad JSON or
encoding (400), queue full or draining (503 + Retry-After). Every 4xx/5xx body is `{"detail": "<sentence>"}`.
Bodies past 64 KiB are parsed on a worker thread, so a big request never stalls /health.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from searchrl import __version__
from searchrl.errors import SearchRLError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.endpoint import RetrieveEndpoint, RetrieveHandler, error_answer
from searchrl.retrieval.metrics import CONTENT_TYPE, RetrievalMetrics
from searchrl.retrieval.ratelog import RateLimitedLog
from searchrl.retrieval.schemas import RetrieveResponse
from searchrl.retrieval.settings import RetrievalSettings
from searchrl.retrieval.validation import ErrorBody, ReadyBody, describe_errors, request_model

log = logging.getLogger(__name__)
_ratelog = RateLimitedLog(log)

_OPEN_PATHS = frozenset({"/health"})
# Backends with a local index that a first search must page in (web backends would spend their budget).
_INDEXED_BACKENDS = frozenset({"dense", "bm25", "hybrid"})
WARM_UP_QUERY = "searchrl warm-up: who directed the seventh seal"


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


class BearerAuth:
    """Require `Authorization: Bearer <key>` on every path but /health.

    /ready needs the token too: SkyServe's probe sends it, so a replica with a wrong or missing token never
    turns READY while every client call would get a 401.

    Accepts one or two tokens (the second during a rotation) and compares with `hmac.compare_digest` against
    each, always both, so the time taken reveals neither which token matched nor how much of it. A plain ASGI
    middleware rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware wraps each request in
    extra tasks and streams, which measurably cuts requests/s under RL burst load (issue 4); and without an
    API key it is not installed at all.
    """

    def __init__(self, app: ASGIApp, *, api_keys: list[str], metrics: RetrievalMetrics) -> None:
        self.app = app
        self.api_keys = [k.encode() for k in api_keys]
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
        presented = token.strip().encode("latin-1", "replace")
        matched = False
        for key in self.api_keys:  # no early exit: every key is compared every time
            matched |= hmac.compare_digest(presented, key)
        if scheme.lower() != "bearer" or not matched:
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


class RequestGuard:
    """Refuse oversized or slow bodies while reading them, and new work while draining.

    The body is read here, chunk by chunk, counting bytes: a declared Content-Length over `max_body_bytes` is
    refused before one byte is read, a chunked body as soon as the count passes the limit, so memory never
    holds more than the limit (a 200 MB body used to be buffered whole: 4.4 GB RSS, /health stalled 12.5 s).
    The whole body must arrive within `body_timeout_s` (408). Refusals close the connection, so the rest of an
    unread body is never parsed. Then the app gets the buffered body as one message.
    """

    def __init__(
        self, app: ASGIApp, *, settings: RetrievalSettings, metrics: RetrievalMetrics, state: Any
    ) -> None:
        self.app = app
        self.max_bytes = settings.max_body_bytes
        self.timeout_s = settings.body_timeout_s
        self.metrics = metrics
        self.state = state

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, kind: str, detail: str, **headers: str
    ) -> None:
        if scope["path"] == "/retrieve":
            self.metrics.observe_request(status, 0, 0.0, kind)
        _ratelog.warning(kind, "refused a request to %s: %s (HTTP %d)", scope["path"], kind, status)
        await _error(status, detail, {"Connection": "close", **headers})(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if getattr(self.state, "draining", False) and scope["path"] == "/retrieve":
            await self._refuse(
                scope,
                receive,
                send,
                503,
                "draining",
                "this replica is shutting down; retry on another replica",
                **{"Retry-After": "1"},
            )
            return
        if scope["method"] not in {"POST", "PUT", "PATCH"}:
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(scope, receive, send, 400, "invalid", "Content-Length is not a number")
                    return
        too_large = (
            f"request body is larger than this server's limit of {self.max_bytes} bytes "
            "(SEARCHRL_RETRIEVAL_MAX_BODY_BYTES); send fewer or shorter queries per request"
        )
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, 413, "too_large", too_large)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        await self._refuse(scope, receive, send, 413, "too_large", too_large)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(
                scope,
                receive,
                send,
                408,
                "slow_body",
                f"request body did not arrive within {self.timeout_s:g}s (SEARCHRL_RETRIEVAL_BODY_TIMEOUT_S)",
            )
            return
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RetrievalAPI(FastAPI):
    """FastAPI, except that POST /retrieve goes straight to `retrieve_lane` (set by `create_app`).

    Why: per request, FastAPI's own layers (error and telemetry middleware, body-limit middleware, routing,
    dependency solving, response classes) cost more CPU than the whole /retrieve handler on the hot path,
    and that CPU is taken from the query encoder on the same cores (issue 14; docs/sizing.md).
    """

    retrieve_lane: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.retrieve_lane
        if (
            lane is not None
            and scope["type"] == "http"
            and scope["path"] == "/retrieve"
            and scope["method"] == "POST"
        ):
            await lane(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: RetrievalSettings, backend: Backend | None = None) -> FastAPI:
    """Build the app; `backend` may be passed in (tests), otherwise `settings.backend` names it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        be = backend or build_backend(settings)
        # Backends that batch (dense, bm25) report batch sizes, queue depth and cache hits to this registry.
        attach = getattr(be, "attach_metrics", None)
        try:
            await be.start()
            # not through a persistent query cache: it would store the query (record, on) or refuse it (replay)
            if settings.warm_up and settings.cache_mode == "off" and be.name in _INDEXED_BACKENDS:
                await _warm_up(be)
        except SearchRLError as exc:
            app.state.startup_error = exc  # run_server reports it as one line (exit 2), not a traceback
            raise
        if callable(attach):  # after the warm-up: /metrics counts clients' queries only
            attach(metrics)
        app.state.backend = be
        log.info("retrieval service ready: %s", be.info())
        watchdog = asyncio.create_task(_watch(app))
        try:
            yield
        finally:
            app.state.draining = True
            # uvicorn has waited for every accepted request by now; this line is what drain tests check
            log.info(
                "drained: %d /retrieve requests answered since start, %d still in flight at shutdown",
                app.state.answered,
                app.state.in_flight,
            )
            watchdog.cancel()
            with suppress(asyncio.CancelledError):
                await watchdog
            await be.close()

    async def _watch(app: FastAPI) -> None:
        """Watchdog: every second, check readiness; log each change once and export it as a gauge."""
        last: str | None = None
        while True:
            problem = _problem(app)
            metrics.set_ready(problem is None)
            if problem != last:
                if problem is None:
                    log.info("ready again")
                else:
                    log.warning("not ready: %s", problem)
                last = problem
            await asyncio.sleep(1.0)

    async def _warm_up(be: Backend) -> None:
        """One search through the index before uvicorn listens (the lifespan runs first), so the probe's first
        200 means a warm index: with mmap, a cold Flat index pages in all of itself on its first search, and
        that batch would outlast `worker_stall_s` and fail /ready under the first real load."""
        started = time.perf_counter()
        await be.search([WARM_UP_QUERY], settings.topk)
        log.info("warm-up: one query through the %s index in %.1fs", be.name, time.perf_counter() - started)

    def _problem(app: FastAPI) -> str | None:
        """Why this replica cannot serve (None when it can); a busy replica can (`Backend.busy`)."""
        if getattr(app.state, "draining", False):
            return "draining for shutdown"
        be: Backend | None = getattr(app.state, "backend", None)
        if be is None:
            return "index not loaded yet"
        return be.problem()

    app = RetrievalAPI(
        title="searchrl retrieval",
        version=__version__,
        lifespan=lifespan,
        description='Search-R1 compatible retrieval. Every error body is {"detail": "<sentence>"}.',
    )
    api_keys = settings.api_keys()  # read once: RETRIEVAL_API_KEY_FILE is not re-read per request
    metrics = RetrievalMetrics()
    app.state.metrics = metrics
    app.state.draining = False
    app.state.answered = 0  # /retrieve 200s (the drain log line reports it)
    app.state.in_flight = 0
    body_model = request_model(settings)
    handler = RetrieveHandler(settings=settings, metrics=metrics, state=app.state, body_model=body_model)

    app.add_middleware(RequestGuard, settings=settings, metrics=metrics, state=app.state)
    if api_keys:
        app.add_middleware(BearerAuth, api_keys=api_keys, metrics=metrics)
    # POST /retrieve: the same guard and token check, then the plain ASGI handler (retrieval/endpoint.py),
    # without FastAPI's per-request middleware, routing and response classes; everything else is FastAPI's.
    lane: ASGIApp = RequestGuard(
        RetrieveEndpoint(handler), settings=settings, metrics=metrics, state=app.state
    )
    app.retrieve_lane = BearerAuth(lane, api_keys=api_keys, metrics=metrics) if api_keys else lane

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = describe_errors(list(exc.errors()), settings)
        if request.url.path == "/retrieve":
            metrics.observe_request(status, 0, 0.0, "invalid")
        return _error(status, detail)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404/405/...: the same {"detail"} body; a 405 lists every method the path has (GET and POST /ready
        are two routes, and Starlette would name only the first one's)."""
        headers = dict(exc.headers or {})
        detail = str(exc.detail)
        path = request.url.path
        if exc.status_code == 405:
            methods = {m for r in app.routes if getattr(r, "path", None) == path for m in r.methods or ()}
            headers["Allow"] = ", ".join(sorted(methods))
            if detail == "Method Not Allowed":  # Starlette's bare phrase: say what the path does take
                detail = (
                    f"{request.method} {path} is not allowed; {path} answers {' and '.join(sorted(methods))}"
                )
                if path == "/retrieve":
                    detail += ' with a JSON body such as {"queries": ["..."], "topk": 3}'
        elif exc.status_code == 404 and detail == "Not Found":
            detail = (
                f"no route {path}: this service answers POST /retrieve, GET /health, GET or POST /ready, "
                "GET /metrics and GET / (every route: GET /openapi.json)"
            )
        return _error(exc.status_code, detail, headers)

    @app.exception_handler(SearchRLError)
    @app.exception_handler(Exception)
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        """The same statuses and sentences as POST /retrieve's own handler (retrieval/endpoint.py)."""
        status, detail, headers = error_answer(exc, settings, request.url.path)
        return _error(status, detail, headers or None)

    @app.get("/health", responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}})
    async def health() -> dict[str, str]:
        """Liveness: the process and its event loop answer. No work, no auth."""
        return {"status": "ok"}

    # With auth on, every route but /health may answer 401 with the error body.
    auth_doc: dict[int | str, dict[str, Any]] = (
        {401: {"model": ErrorBody, "description": "missing or wrong bearer token"}} if api_keys else {}
    )
    ready_doc: dict[str, Any] = {
        "response_model": ReadyBody,
        "responses": {503: {"model": ReadyBody, "description": "not ready; `detail` says why"}, **auth_doc},
    }

    @app.post("/ready", operation_id="ready_post", **ready_doc)
    @app.get("/ready", operation_id="ready_get", **ready_doc)
    async def ready(request: Request) -> JSONResponse:
        """Readiness for load balancers (SkyServe's probe): 200 only when this replica can serve now.

        POST is accepted (and its body ignored) because SkyServe's probe POSTs when `post_data` is set.
        """
        problem = _problem(request.app)
        if problem is not None:  # a fault, even if the replica is also busy
            return JSONResponse({"ready": False, "detail": problem}, status_code=503)
        # A saturated replica that still computes stays ready and sheds with 503 + Retry-After at /retrieve;
        # failing /ready instead would make SkyServe stop routing to it (with one replica: 503 for every call)
        # and tear it down after 180 s of failed probes.
        busy = request.app.state.backend.busy()
        if busy is not None:
            return JSONResponse(
                {"ready": True, "detail": f"busy: {busy}; /retrieve sheds with 503 when full"}
            )
        return JSONResponse({"ready": True, "detail": "ok"})

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus"},
            **auth_doc,
        },
    )
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition format (needs the bearer token when auth is on)."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", responses=auth_doc)
    async def describe(request: Request) -> dict[str, Any]:
        be: Backend = request.app.state.backend
        return {
            "service": "searchrl-retrieval",
            "version": __version__,
            **be.info(),
            "default_topk": settings.topk,
            "max_topk": settings.max_topk,
            "max_queries": settings.max_queries,
            "max_body_bytes": settings.max_body_bytes,
            "auth": bool(api_keys),
        }

    error_doc = {"model": ErrorBody}
    retrieve_responses: dict[int | str, dict[str, Any]] = {
        400: {**error_doc, "description": "body is not valid JSON or not UTF-8"},
        404: {**error_doc, "description": "replay cache mode and the query was never recorded"},
        408: {**error_doc, "description": f"body did not arrive within {settings.body_timeout_s:g}s"},
        413: {**error_doc, "description": f"body larger than {settings.max_body_bytes} bytes"},
        422: {**error_doc, "description": "body breaks the schema (limits, types, unknown fields)"},
        429: {**error_doc, "description": "a web backend's request budget is spent"},
        500: {**error_doc, "description": "bug (see the server log)"},
        502: {**error_doc, "description": "the backend failed to answer"},
        503: {
            **error_doc,
            "description": "queue full, request deadline passed, or draining: retry after Retry-After",
            "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}},
        },
    }
    retrieve_responses.update(auth_doc)

    @app.post(
        "/retrieve",
        response_model=RetrieveResponse,
        responses=retrieve_responses,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body_model.model_json_schema()}},
            }
        },
    )
    async def retrieve(request: Request) -> Response:
        """Top-k passages per query, in query order (Search-R1 contract).

        Requests reach `RetrieveEndpoint` first, which answers them with the same handler; this route is what
        the OpenAPI schema documents, and it answers the same way if the app is mounted without that layer.
        """
        status, body, headers = await handler.respond(await request.body())
        return Response(
            body,
            status_code=status,
            headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers},
            media_type="application/json",
        )

    return app


__all__ = ["create_app"]
