"""POST /retrieve as the OpenAPI schema documents it.

Requests normally reach `RetrieveEndpoint` (retrieval/serving/endpoint.py, the fast lane `RetrievalAPI` sends them to)
first, which answers with the same handler; this route is what the schema shows, and it answers the same way
if the app is mounted without that layer. The handler is `app.state.retrieve_handler`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from searchrl.retrieval.api.probes import auth_responses
from searchrl.retrieval.schemas import RetrieveResponse
from searchrl.retrieval.serving.validation import ErrorBody
from searchrl.retrieval.settings import RetrievalSettings


async def retrieve(request: Request) -> Response:
    """Top-k passages per query, in query order (Search-R1 contract).

    Requests reach `RetrieveEndpoint` first, which answers them with the same handler; this route is what
    the OpenAPI schema documents, and it answers the same way if the app is mounted without that layer.
    """
    status, body, headers = await request.app.state.retrieve_handler.respond(await request.body())
    return Response(
        body,
        status_code=status,
        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers},
        media_type="application/json",
    )


def retrieve_responses(settings: RetrievalSettings, *, auth: bool) -> dict[int | str, dict[str, Any]]:
    """Every status POST /retrieve answers besides 200, with the limits these settings set."""
    error_doc = {"model": ErrorBody}
    return {
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
        **auth_responses(auth),
    }


def retrieve_router(settings: RetrievalSettings, body_model: type[BaseModel], *, auth: bool) -> APIRouter:
    router = APIRouter()
    router.add_api_route(
        "/retrieve",
        retrieve,
        methods=["POST"],
        response_model=RetrieveResponse,
        responses=retrieve_responses(settings, auth=auth),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body_model.model_json_schema()}},
            }
        },
    )
    return router


__all__ = ["retrieve_router"]
