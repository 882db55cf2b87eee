"""The ASGI layers in front of the retrieval app: bearer auth, the body guard (size, deadline, draining), and the
fast lane that sends POST /retrieve past FastAPI's per-request machinery (issue 14)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from searchrl.retrieval.serving.metrics import RetrievalMetrics
from searchrl.retrieval.serving.ratelog import RateLimitedLog
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)
_ratelog = RateLimitedLog(log)

OPEN_PATHS = frozenset({"/health"})


def error_response(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Every 4xx/5xx body: `{"detail": "<sentence>"}`."""
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
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
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
            response = error_response(
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
        await error_response(status, detail, {"Connection": "close", **headers})(scope, receive, send)

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
    """FastAPI, except that POST /retrieve goes straight to `retrieve_lane` (set by `searchrl.retrieval.serving.app.create_app`).

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


__all__ = ["OPEN_PATHS", "BearerAuth", "RequestGuard", "RetrievalAPI", "error_response"]
