"""Run a real uvicorn server on a free loopback port in a thread, for live tests.

Poll for readiness (never sleep) and stop the server when the block ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

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

    `uvicorn_kwargs` go to uvicorn.Config (e.g. the service's own settings from searchrl.retrieval.server.make_config).
    """
    port = port or free_port()
    kwargs: dict[str, Any] = {"host": "127.0.0.1", "log_level": "warning", "lifespan": "on", **uvicorn_kwargs}
    config = uvicorn.Config(app, port=port, **kwargs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if not thread.is_alive():
                raise RuntimeError("server thread exited during start-up (see the log above)")
            try:
                if httpx.get(base + ready_path, timeout=1.0).status_code == 200 and server.started:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {base} not ready after {timeout}s")
            time.sleep(0.05)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)
