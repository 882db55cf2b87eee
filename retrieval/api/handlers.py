"""Exception handlers: every error the FastAPI routes raise answers `{"detail": "<sentence>"}` with the status and
sentence POST /retrieve's own handler (retrieval/serving/endpoint.py) gives; a 404 or 405 says what the service answers."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from searchrl.errors import SearchRLError
from searchrl.retrieval.api.middleware import error_response
from searchrl.retrieval.serving.endpoint import error_answer
from searchrl.retrieval.serving.validation import describe_errors


def allowed_methods(app: FastAPI, path: str) -> set[str]:
    """Every method a path answers: FastAPI's own routes (/openapi.json, /docs) and the ones the routers added
    (`app.state.route_methods`, as an included router's routes are not listed in `app.routes`)."""
    methods = {
        m for r in app.routes if getattr(r, "path", None) == path for m in getattr(r, "methods", None) or ()
    }
    added: set[str] = app.state.route_methods.get(path, set())
    return methods | added


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    status, detail = describe_errors(list(exc.errors()), request.app.state.settings)
    if request.url.path == "/retrieve":
        request.app.state.metrics.observe_request(status, 0, 0.0, "invalid")
    return error_response(status, detail)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """404/405/...: the same {"detail"} body; a 405 lists every method the path has (GET and POST /ready
    are two routes, and Starlette would name only the first one's)."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    detail = str(exc.detail)
    path = request.url.path
    if exc.status_code == 405:
        methods = allowed_methods(request.app, path)
        headers["Allow"] = ", ".join(sorted(methods))
        if detail == "Method Not Allowed":  # Starlette's bare phrase: say what the path does take
            detail = f"{request.method} {path} is not allowed; {path} answers {' and '.join(sorted(methods))}"
            if path == "/retrieve":
                detail += ' with a JSON body such as {"queries": ["..."], "topk": 3}'
    elif exc.status_code == 404 and detail == "Not Found":
        detail = (
            f"no route {path}: this service answers POST /retrieve, GET /health, GET or POST /ready, "
            "GET /metrics and GET / (every route: GET /openapi.json)"
        )
    return error_response(exc.status_code, detail, headers)


async def on_error(request: Request, exc: Exception) -> JSONResponse:
    """The same statuses and sentences as POST /retrieve's own handler (retrieval/serving/endpoint.py)."""
    status, detail, headers = error_answer(exc, request.app.state.settings, request.url.path)
    return error_response(status, detail, headers or None)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(SearchRLError, on_error)
    app.add_exception_handler(Exception, on_error)


__all__ = ["add_error_handlers"]
