"""Run the retrieval service with uvicorn in the foreground (what `searchrl serve` and SkyServe run).

Slow clients (issue 13): uvicorn closes idle keep-alive connections but has no deadline for a request's
*headers*, so 400 connections sending a byte a second stayed open indefinitely. `_GuardedHttpTools` adds one:
headers must arrive within `header_timeout_s` and stay under `max_header_bytes`, or the connection is closed.
The body deadline and size limit are enforced by the app (`searchrl.retrieval.api.middleware.RequestGuard`), and `max_connections`
is uvicorn's `limit_concurrency` (503 past it). SIGTERM: `DrainingServer` marks the app as draining (/ready
503, new /retrieve 503) and uvicorn finishes every accepted request before the lifespan stops the backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from searchrl.errors import ConfigError
from searchrl.retrieval.serving.ratelog import RateLimitFilter
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

_BODY_431 = b'{"detail":"request headers are larger than this server accepts (max_header_bytes)"}'
_TOO_LARGE_HEADERS = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY_431), _BODY_431)
)


def check_bind(settings: RetrievalSettings) -> None:
    """Refuse a public bind without an API key: SkyServe exposes the port and has no auth of its own."""
    if settings.is_public_bind and not settings.api_keys() and not settings.insecure:
        raise ConfigError(
            f"refusing to listen on {settings.host} without an API key: set RETRIEVAL_API_KEY or "
            "RETRIEVAL_API_KEY_FILE (clients send 'Authorization: Bearer <key>') or pass --insecure"
        )


def check_port(settings: RetrievalSettings) -> None:
    """Refuse a port something already listens on, before the index loads (minutes) instead of after."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is fine
            sock.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {settings.port} on {settings.host} is already in use (another `searchrl serve`?): "
                "stop that process or pass --port N (SEARCHRL_RETRIEVAL_PORT)"
            ) from None
        raise ConfigError(
            f"cannot bind {settings.host}:{settings.port} ({exc.strerror or exc}): check --host and --port"
        ) from None


def guarded_protocol(header_timeout_s: float, max_header_bytes: int) -> type:
    """uvicorn's httptools protocol with a header deadline and a header size cap (see module docstring)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _GuardedHttpTools(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def _arm(self) -> None:
            self._disarm()
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            awaiting_headers = self._header_timer is not None
            super().data_received(data)  # on_headers_complete disarms the timer if the headers ended here
            if awaiting_headers and self._header_timer is not None:
                self._header_bytes += len(data)
                if self._header_bytes > max_header_bytes and not self.transport.is_closing():
                    self._disarm()
                    self.transport.write(_TOO_LARGE_HEADERS)
                    self.transport.close()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._arm()  # the next request's headers get the same deadline

    return _GuardedHttpTools


def make_config(app: Any, settings: RetrievalSettings, **overrides: Any) -> Any:
    """The uvicorn.Config the service runs with (tests and the reliability benchmark use it too)."""
    import uvicorn

    kwargs: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": "info",  # prints "Uvicorn running on http://HOST:PORT" once listening
        "timeout_graceful_shutdown": settings.drain_timeout_s,
        # access logs off: one line per rollout request would swamp the log at hundreds of requests/s
        "access_log": False,
        # nothing here reads the client address (no access log, no per-client limits), so skip uvicorn's
        # X-Forwarded-For middleware: a few percent of the event loop's CPU per request (issue 14)
        "proxy_headers": False,
        "http": guarded_protocol(settings.header_timeout_s, settings.max_header_bytes),
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": settings.keep_alive_s,
        "lifespan": "on",
    }
    kwargs.update(overrides)
    config = uvicorn.Config(app, **kwargs)  # configures uvicorn's loggers: add the filter after
    quiet_uvicorn_floods()
    return config


_UVICORN_FILTER = RateLimitFilter()


def quiet_uvicorn_floods() -> None:
    """Aggregate uvicorn's per-connection warnings (one line per refused connection under overload)."""
    uv = logging.getLogger("uvicorn.error")
    if _UVICORN_FILTER not in uv.filters:
        uv.addFilter(_UVICORN_FILTER)


def draining_server(config: Any) -> Any:
    """A uvicorn.Server that tells the app it is draining as soon as SIGTERM/SIGINT arrives."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            state = getattr(config.app, "state", None)
            if state is not None and not getattr(state, "draining", False):
                state.draining = True
                log.info("signal %d: draining (finishing accepted requests, refusing new ones)", sig)
            super().handle_exit(sig, frame)

    return DrainingServer(config)


def run_server(settings: RetrievalSettings) -> None:
    """Prepare the index (build on first use), then serve until SIGINT/SIGTERM."""
    # Before torch/faiss load their OpenMP runtime: spinning OpenMP threads starve the event loop (issue 4).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from searchrl.retrieval.backends import build_backend
    from searchrl.retrieval.serving.app import create_app

    check_bind(settings)
    check_port(settings)
    if settings.is_public_bind and not settings.api_keys():
        log.warning("serving on %s WITHOUT authentication (--insecure)", settings.host)
    # Built here, not in the lifespan: a backend that cannot be configured (a missing key, say) is one line.
    app = create_app(settings, build_backend(settings))
    log.info(
        "retrieval service (%s backend) will listen on http://%s:%d",
        settings.backend,
        settings.host,
        settings.port,
    )
    # One that fails while loading (a mismatching index, an encoder the quality gate refuses) fails inside
    # uvicorn's lifespan, which would log a traceback: drop uvicorn's lines for it and raise it here instead.
    quiet = _StartupErrorFilter(app)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)
    try:
        draining_server(make_config(app, settings)).run()
    except SystemExit:  # uvicorn's exit 3 after a failed start-up
        error = getattr(app.state, "startup_error", None)
        if error is None:
            raise
        raise error from None
    finally:
        uvicorn_log.removeFilter(quiet)


class _StartupErrorFilter(logging.Filter):
    """Drops uvicorn's ERROR lines (the lifespan traceback, "Application startup failed") once the app has
    recorded a SearchRLError from start-up, which run_server then raises for the CLI's one-line error."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        failed = getattr(self.app.state, "startup_error", None) is not None
        return not (failed and record.levelno >= logging.ERROR)
