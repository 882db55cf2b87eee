"""`searchrl serve` replicas for the reliability scenarios (searchrl/bench/reliability.py): started through
retrieval/process.py, restartable on the same port, signalled (SIGKILL, SIGSTOP, SIGTERM) and measured (RSS).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.bench.procfs import vm_status
from searchrl.retrieval.process import free_port, serve_command, start_process, wait_until_ready
from searchrl.retrieval.settings import RetrievalSettings


@dataclass
class Replica:
    """One `searchrl serve` subprocess (what SkyServe runs per replica), restartable on the same port."""

    settings: RetrievalSettings
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> Replica:
        s = self.settings
        args = ["--backend", s.backend, "--corpus", s.corpus, "--data-dir", str(s.data_dir), "--no-build"]
        env = {**os.environ, "SEARCHRL_LOG_LEVEL": "WARNING", **self.env}
        self.proc = start_process(serve_command(args, self.port), self.log_path, env=env, append=True)
        try:
            wait_until_ready(
                self.url,
                self.proc,
                path="/ready",
                timeout_s=timeout_s,
                interval_s=0.05,
                log_path=self.log_path,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def rss(self) -> int:
        assert self.proc is not None
        return vm_status(self.proc.pid)["VmRSS"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)


@contextmanager
def replicas(
    settings: RetrievalSettings, n: int, workdir: Path, env: dict[str, str] | None = None
) -> Iterator[list[Replica]]:
    """Start `n` replicas (index prepared once, before), stop every one on exit."""
    from searchrl.retrieval.index.build import ensure_index

    ensure_index(settings, settings.backend if settings.backend in ("bm25", "dense") else "bm25")
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"SEARCHRL_RETRIEVAL_CACHE_SIZE": "0", **(env or {})}
    started: list[Replica] = []
    try:
        for i in range(n):
            started.append(Replica(settings, workdir / f"replica-{i}.log", env=env).start())
        yield started
    finally:
        for r in started:
            r.stop()


__all__ = ["Replica", "replicas"]
