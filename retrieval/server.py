"""Run the retrieval service with uvicorn in the foreground (what `searchrl serve` and SkyServe run)."""

from __future__ import annotations

import logging
import os

from retrieval.settings import RetrievalSettings
from searchrl.errors import ConfigError

log = logging.getLogger(__name__)


def check_bind(settings: RetrievalSettings) -> None:
    """Refuse a public bind without an API key: SkyServe exposes the port and has no auth of its own."""
    if settings.is_public_bind and settings.api_key_value() is None and not settings.insecure:
        raise ConfigError(
            f"refusing to listen on {settings.host} without an API key: set RETRIEVAL_API_KEY "
            "(clients send 'Authorization: Bearer <key>') or pass --insecure"
        )


def run_server(settings: RetrievalSettings) -> None:
    """Prepare the index (build on first use), then serve until SIGINT/SIGTERM."""
    # Before torch/faiss load their OpenMP runtime: spinning OpenMP threads starve the event loop (issue 4).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from retrieval.app import create_app

    check_bind(settings)
    if settings.is_public_bind and settings.api_key_value() is None:
        log.warning("serving on %s WITHOUT authentication (--insecure)", settings.host)
    app = create_app(settings)
    log.info(
        "retrieval service (%s backend) will listen on http://%s:%d",
        settings.backend,
        settings.host,
        settings.port,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",  # prints "Uvicorn running on http://HOST:PORT" once listening
        timeout_graceful_shutdown=30,
        # access logs off: one line per rollout request would swamp the log at hundreds of requests/s
        access_log=False,
    )
