"""GET /health (liveness), GET|POST /ready (readiness), GET /metrics (Prometheus) and GET / (description).

Handlers read the app's state (`settings`, `metrics`, `backend`, `auth`); `probes_router` only takes what the
OpenAPI schema documents: whether a 401 is possible.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from searchrl import __version__
from searchrl.retrieval.api.lifespan import readiness_problem
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.serving.metrics import CONTENT_TYPE
from searchrl.retrieval.serving.validation import ErrorBody, ReadyBody


def auth_responses(auth: bool) -> dict[int | str, dict[str, Any]]:
    """With auth on, every route but /health may answer 401 with the error body."""
    return {401: {"model": ErrorBody, "description": "missing or wrong bearer token"}} if auth else {}


async def health() -> dict[str, str]:
    """Liveness: the process and its event loop answer. No work, no auth."""
    return {"status": "ok"}


async def ready(request: Request) -> JSONResponse:
    """Readiness for load balancers (SkyServe's probe): 200 only when this replica can serve now.

    POST is accepted (and its body ignored) because SkyServe's probe POSTs when `post_data` is set.
    """
    problem = readiness_problem(request.app)
    if problem is not None:  # a fault, even if the replica is also busy
        return JSONResponse({"ready": False, "detail": problem}, status_code=503)
    # A saturated replica that still computes stays ready and sheds with 503 + Retry-After at /retrieve;
    # failing /ready instead would make SkyServe stop routing to it (with one replica: 503 for every call)
    # and tear it down after 180 s of failed probes.
    busy = request.app.state.backend.busy()
    if busy is not None:
        return JSONResponse({"ready": True, "detail": f"busy: {busy}; /retrieve sheds with 503 when full"})
    return JSONResponse({"ready": True, "detail": "ok"})


async def prometheus_metrics(request: Request) -> Response:
    """Prometheus text exposition format (needs the bearer token when auth is on)."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


async def describe(request: Request) -> dict[str, Any]:
    state = request.app.state
    be: Backend = state.backend
    settings = state.settings
    return {
        "service": "searchrl-retrieval",
        "version": __version__,
        **be.info(),
        "default_topk": settings.topk,
        "max_topk": settings.max_topk,
        "max_queries": settings.max_queries,
        "max_body_bytes": settings.max_body_bytes,
        "auth": state.auth,
    }


def probes_router(*, auth: bool) -> APIRouter:
    router = APIRouter()
    auth_doc = auth_responses(auth)
    router.add_api_route(
        "/health", health, responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}}
    )
    ready_doc: dict[str, Any] = {
        "response_model": ReadyBody,
        "responses": {503: {"model": ReadyBody, "description": "not ready; `detail` says why"}, **auth_doc},
    }
    router.add_api_route("/ready", ready, methods=["GET"], operation_id="ready_get", **ready_doc)
    router.add_api_route("/ready", ready, methods=["POST"], operation_id="ready_post", **ready_doc)
    router.add_api_route(
        "/metrics",
        prometheus_metrics,
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus"},
            **auth_doc,
        },
    )
    router.add_api_route("/", describe, responses=auth_doc)
    return router


__all__ = ["auth_responses", "probes_router"]
