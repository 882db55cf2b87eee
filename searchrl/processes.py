"""Stopping a child process: the one function retrieval, trainer and infer stop theirs with.

Three children are stopped, each with the signal it shuts down cleanly on: `searchrl serve` (retrieval/process.py
and the benches) gets SIGTERM, uvicorn's graceful drain, as SkyServe scales a replica down; sglang's server
(infer/sglang.py) SIGTERM; verl's trainer (trainer/supervisor.py) SIGINT, so that Python's atexit runs
`ray.shutdown` for the Ray it started. Each gets `grace_s` to exit, then SIGKILL.

A child started with `start_new_session=True` leads a process group of its own, and the whole group gets the
signals: sglang's scheduler and detokenizer and verl's Ray processes stop with their parent instead of living on
as orphans, and what is left of the group once the leader exits gets SIGKILL. A child in our own group gets them
alone (signalling that group would signal us).

The other direction, being stopped (`unwinding_on_sigterm`): `searchrl train` keeps its children (verl in a
session of its own, the retrieval service, vLLM's servers) alive only while it runs. SIGTERM's default action ends
the CLI at once, so `kill`, a CI runner's timeout or a scheduler's cancel left them running, Ray and a vLLM engine
holding gigabytes (found on 2026-12-07: `make learn-search` killed with SIGTERM left verl, Ray's raylet and the BM25
service behind). Inside `unwinding_on_sigterm`, SIGTERM raises KeyboardInterrupt instead, exactly as Ctrl-C does, so
every `with` and `finally` on the way out stops what it started (`terminated_by` tells the two apart).

Bottom layer: standard library only, imports nothing from retrieval/, trainer/, infer/, cli/ or deploy/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

_RECEIVED: list[signal.Signals] = []  # the signals `unwinding_on_sigterm` turned into KeyboardInterrupt


@contextlib.contextmanager
def unwinding_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does (module docstring), and
    `terminated_by` says it was SIGTERM; the previous handler is put back on the way out. Off the main thread (where
    Python allows no handler) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        _RECEIVED.append(signal.Signals(signum))
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def terminated_by() -> signal.Signals | None:
    """The signal `unwinding_on_sigterm` turned into the KeyboardInterrupt being handled; None for a real Ctrl-C."""
    return _RECEIVED[-1] if _RECEIVED else None


def _leads_group(pid: int) -> bool:
    """Whether `pid` leads its process group (it was started in a session of its own); False once it is gone."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def stop_process(
    proc: subprocess.Popen[Any], grace_s: float = 30.0, *, sig: signal.Signals = signal.SIGTERM
) -> int:
    """`sig` to `proc`, or to its process group when it leads one, then SIGKILL after `grace_s`; its exit code.

    When this returns, `proc` has exited and been reaped, and a group it led has no process left.
    """
    if proc.returncode is not None:  # reaped already: its pid may be another process's by now
        return proc.returncode
    group = _leads_group(proc.pid)

    def send(signum: signal.Signals) -> None:
        try:
            if group:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)  # a no-op once Popen has reaped it
        except ProcessLookupError:  # it (and its group) exited on their own
            pass

    send(sig)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
    else:
        if group:  # the leader is gone; a child of it that ignored `sig` (or is still shutting down) is not
            send(signal.SIGKILL)
    return proc.wait()


__all__ = ["stop_process", "terminated_by", "unwinding_on_sigterm"]
