"""`searchrl serve` as a child process on a free loopback port: the one way to start it and wait for it.

`searchrl smoke`, `make train-cpu`, every bench (searchrl/bench/) and the live tests that need the real service
(the CLI a user runs, its own process and event loop) start it here and poll it with `wait_until_ready`, the one
readiness loop; each stops it whatever happens inside its block (searchrl/processes.py `stop_process`: SIGTERM,
uvicorn's graceful drain, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from searchrl.errors import SearchRLError
from searchrl.http import wait_until_ready as http_wait_until_ready
from searchrl.processes import stop_process


def free_port() -> int:
    """A TCP port nobody listens on right now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(args: Sequence[str], port: int, host: str = "127.0.0.1") -> list[str]:
    """`python -m searchrl serve --host HOST --port PORT ARGS`, with this interpreter."""
    return [sys.executable, "-m", "searchrl", "serve", "--host", host, "--port", str(port), *args]


def start_process(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """`cmd` in the background, stdout and stderr into `log_path` (appended to with `append`, as a restart does)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            list(cmd), env=None if env is None else dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )


def wait_until_ready(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    path: str = "/health",
    json: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    interval_s: float = 0.1,
    request_timeout_s: float = 1.0,
    log_path: Path | None = None,
) -> None:
    """Poll `url + path` (GET, or POST `json` as a readiness probe does) every `interval_s` until it answers 200.

    Raises SearchRLError, naming the log, when `proc` exits first or nothing answers 200 within `timeout_s`. The
    loop is searchrl/http.py's `wait_until_ready`, the one every readiness wait in the repo goes through.
    """
    see = f"; see {log_path}" if log_path else ""
    with httpx.Client(timeout=request_timeout_s, headers=dict(headers or {})) as client:

        def answers_200() -> bool:
            if proc is not None and proc.poll() is not None:
                raise SearchRLError(
                    f"the server for {url} exited with {proc.returncode} during start-up{see}"
                )
            if json is None:
                return client.get(url + path).status_code == 200
            return client.post(url + path, json=json).status_code == 200

        if not http_wait_until_ready(answers_200, timeout_s=timeout_s, interval_s=interval_s):
            raise SearchRLError(f"no 200 from {url}{path} after {timeout_s:g}s{see}")


def start_ready(
    cmd: Sequence[str],
    url: str,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = False,
    **ready: Any,
) -> subprocess.Popen[bytes]:
    """`start_process`, then `wait_until_ready(url, ...)` with `ready`; the process is stopped if it never is."""
    proc = start_process(cmd, log_path, env=env, cwd=cwd, append=append)
    try:
        wait_until_ready(url, proc, log_path=log_path, **ready)
    except BaseException:
        stop_process(proc, grace_s=10)
        raise
    return proc


@contextlib.contextmanager
def served(args: Sequence[str], log_path: Path) -> Iterator[str]:
    """`searchrl serve ARGS` on a free loopback port, stopped (SIGTERM, then SIGKILL) when the block ends.

    Yields the base URL at once: the caller waits for readiness its own way (a health check with a deadline).
    """
    port = free_port()
    proc = start_process(serve_command(args, port), log_path)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


__all__ = [
    "free_port",
    "serve_command",
    "served",
    "start_process",
    "start_ready",
    "wait_until_ready",
]
