"""Run a real uvicorn server on a free loopback port in a thread, for live tests.

Poll for readiness (never sleep) and stop the server when the block ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from searchrl.http import wait_until_ready
from searchrl.retrieval.process import free_port


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    *,
    port: int | None = None,
    ready_path: str = "/health",
    timeout: float = 300.0,
    **uvicorn_kwargs: Any,
) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 and yield its base URL once `ready_path` answers 200.

    `uvicorn_kwargs` go to uvicorn.Config (e.g. the service's own settings from searchrl.retrieval.serving.server.make_config).
    """
    port = port or free_port()
    kwargs: dict[str, Any] = {"host": "127.0.0.1", "log_level": "warning", "lifespan": "on", **uvicorn_kwargs}
    config = uvicorn.Config(app, port=port, **kwargs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not thread.is_alive():
            raise RuntimeError("server thread exited during start-up (see the log above)")
        return httpx.get(base + ready_path, timeout=1.0).status_code == 200 and server.started

    try:
        if not wait_until_ready(ready, timeout_s=timeout, interval_s=0.05):
            raise TimeoutError(f"server on {base} not ready after {timeout}s")
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def serve_tiny_service(data_dir: Path, **fields: Any) -> Iterator[str]:
    """The retrieval service over the 20-passage fixture corpus, its indexes in `data_dir` and the rest of its
    RetrievalSettings from `fields` (backend, api_key, ...), served as `serve_in_thread` does; yields its URL."""
    from searchrl.retrieval.serving.app import create_app
    from searchrl.retrieval.settings import RetrievalSettings
    from tests.conftest import TINY_CORPUS

    settings = RetrievalSettings(corpus=str(TINY_CORPUS), data_dir=data_dir, **fields)
    with serve_in_thread(create_app(settings)) as url:
        yield url


def healthy_app() -> FastAPI:
    """A FastAPI app whose GET /health answers {"status": "ok"} as the service's does, so that `serve_in_thread`
    sees it ready: a fake upstream adds its own routes to it."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
