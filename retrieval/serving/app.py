"""The retrieval service: FastAPI app speaking the Search-R1 /retrieve contract (retrieval/schemas.py).

Run it with `searchrl serve` (or `make serve-retrieval`). `create_app(settings)` builds nothing at import time:
the backend is built and loaded in the lifespan, so tests and the CLI pass their own settings.

Routes:
    POST /retrieve   Search-R1 batch body or SkyRL single-query body -> {"result": [[...], ...]}
    GET  /health     liveness only: the process answers; no work, never needs auth
    GET|POST /ready  readiness: index loaded and warmed by one query, batch worker alive and not stalled, not
                     draining (503 with the reason otherwise; a saturated queue is "busy", still 200); needs
                     the token when auth is on, so a probe also proves the replica's token matches the clients'
    GET  /metrics    Prometheus text format (retrieval/serving/metrics.py); needs the bearer token like /retrieve
    GET  /           JSON description: backend, corpus size, index type, encoder, version

Limits (issue 13; every one is in the OpenAPI schema): body size (413, refused while reading, before the body
is buffered), body read deadline (408), queries/topk/query length as schema constraints (422), bad JSON or
encoding (400), queue full or draining (503 + Retry-After). Every 4xx/5xx body is `{"detail": "<sentence>"}`.
Bodies past 64 KiB are parsed on a worker thread, so a big request never stalls /health.

The pieces, one job each, in retrieval/api/: middleware.py (auth, body guard, the /retrieve fast lane),
lifespan.py (backend start, warm-up, readiness watchdog, drain), handlers.py (error bodies), probes.py
(/health, /ready, /metrics, /) and retrieve.py (POST /retrieve's documented route). They share the app's
`state`, which `create_app` fills.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp

from searchrl import __version__
from searchrl.retrieval.api.handlers import add_error_handlers
from searchrl.retrieval.api.lifespan import lifespan
from searchrl.retrieval.api.middleware import BearerAuth, RequestGuard, RetrievalAPI
from searchrl.retrieval.api.probes import probes_router
from searchrl.retrieval.api.retrieve import retrieve_router
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.serving.endpoint import RetrieveEndpoint, RetrieveHandler
from searchrl.retrieval.serving.metrics import RetrievalMetrics
from searchrl.retrieval.serving.validation import request_model
from searchrl.retrieval.settings import RetrievalSettings


def create_app(settings: RetrievalSettings, backend: Backend | None = None) -> FastAPI:
    """Build the app; `backend` may be passed in (tests), otherwise `settings.backend` names it."""
    app = RetrievalAPI(
        title="searchrl retrieval",
        version=__version__,
        lifespan=lifespan,
        description='Search-R1 compatible retrieval. Every error body is {"detail": "<sentence>"}.',
    )
    api_keys = settings.api_keys()  # read once: RETRIEVAL_API_KEY_FILE is not re-read per request
    metrics = RetrievalMetrics()
    body_model = request_model(settings)
    state = app.state
    state.settings = settings
    state.backend_override = backend
    state.metrics = metrics
    state.auth = bool(api_keys)
    state.draining = False
    state.answered = 0  # /retrieve 200s (the drain log line reports it)
    state.in_flight = 0
    state.retrieve_handler = RetrieveHandler(
        settings=settings, metrics=metrics, state=state, body_model=body_model
    )

    app.add_middleware(RequestGuard, settings=settings, metrics=metrics, state=state)
    if api_keys:
        app.add_middleware(BearerAuth, api_keys=api_keys, metrics=metrics)
    # POST /retrieve: the same guard and token check, then the plain ASGI handler (retrieval/serving/endpoint.py),
    # without FastAPI's per-request middleware, routing and response classes; everything else is FastAPI's.
    lane: ASGIApp = RequestGuard(
        RetrieveEndpoint(state.retrieve_handler), settings=settings, metrics=metrics, state=state
    )
    app.retrieve_lane = BearerAuth(lane, api_keys=api_keys, metrics=metrics) if api_keys else lane
    add_error_handlers(app)
    state.route_methods = {}  # path -> methods, for a 405's Allow header (retrieval/api/handlers.py)
    for router in (probes_router(auth=state.auth), retrieve_router(settings, body_model, auth=state.auth)):
        app.include_router(router)
        for route in router.routes:
            if isinstance(route, APIRoute):
                state.route_methods.setdefault(route.path, set()).update(route.methods)
    return app


__all__ = ["create_app"]
