"""`searchrl serve` as a child process on a free loopback port: what `searchrl smoke` and `make train-cpu` start.

Both need the real service (the CLI a user runs, its own process and event loop) for the length of one block,
stopped whatever happens inside it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody listens on right now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM (uvicorn's graceful shutdown, as SkyServe scales a replica down), then SIGKILL after `timeout_s`;
    returns the exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextlib.contextmanager
def served(args: Sequence[str], log_path: Path) -> Iterator[str]:
    """`searchrl serve ARGS` on a free loopback port, stopped (SIGTERM, then SIGKILL) when the block ends.

    Yields the base URL at once: the caller waits for readiness its own way (a health check with a deadline).
    """
    port = free_port()
    cmd = [sys.executable, "-m", "searchrl", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(proc)


__all__ = ["free_port", "served", "stop_process"]
