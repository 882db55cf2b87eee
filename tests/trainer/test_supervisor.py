"""trainer/supervisor.py: the one verl supervisor, with a real child process standing in for verl (a Python script
printing verl's `step:N - ...` console lines, with a grandchild in its process group as Ray's processes are): the
first step whose check fails stops it there, its whole group included, and a run past its time limit ends 124."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from searchrl.errors import SmokeCheckError, StepCheckError
from searchrl.trainer import supervisor
from searchrl.trainer.step_checks import StepRow
from searchrl.trainer.step_lines import LINE_END
from searchrl.trainer.supervisor import TIMED_OUT, supervise
from tests.test_processes import _alive

# A verl that ignores SIGINT (so only SIGKILL after the grace stops it) and has started a grandchild that ignores it
# too; it prints both pids, then its lines (each `"ENV:NAME"` as that variable's value), then trains on.
STANDIN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
grandchild = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
grandchild.stdout.readline()
print(f"pids {os.getpid()} {grandchild.pid}", flush=True)
for line in sys.argv[1:]:
    print(os.environ.get(line[4:], "unset") if line.startswith("ENV:") else line, flush=True)
time.sleep(600)
"""


def _verl(*lines: str) -> list[str]:
    return [sys.executable, "-c", STANDIN, *lines]


def _step(n: int, in_loss: float = 0.0) -> str:
    return f"(TaskRunnerV1 pid=7) step:{n} - search/calls:4.0 - loss/observation_tokens_in_loss:{in_loss}{LINE_END}"


def _in_loss(row: StepRow) -> list[str]:
    tokens = row.metrics["loss/observation_tokens_in_loss"]
    return [f"step {row.step}: observation tokens in loss {tokens:g}"] if tokens else []


class Seen:
    """What the hooks were handed, and the stand-in's pids."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.steps: list[int] = []

    def line(self, line: str) -> None:
        self.lines.append(line)

    def check(self, row: StepRow) -> list[str]:
        self.steps.append(row.step)
        return _in_loss(row)

    def pids(self) -> tuple[int, int]:
        first = next(line for line in self.lines if line.startswith("pids "))
        verl, grandchild = map(int, first.split()[1:])
        return verl, grandchild


def _gone(*pids: int) -> bool:
    """Every pid exited (a killed grandchild is reaped by whoever adopted it, maybe a moment later)."""
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(_alive, pids))


def test_the_first_bad_step_stops_verl_and_its_whole_process_group(tmp_path: Path, monkeypatch) -> None:
    """Step 2 has tool responses in its loss: verl is stopped there (step 3, already printed, is never checked),
    SIGINT ignored, so SIGKILL after the grace to the whole group, and one line names the step and the log. The
    step log keeps only the step lines, appended to across invocations, as <run>/searchrl/steps.log does."""
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 1.0)
    steps_log = tmp_path / "searchrl" / "steps.log"
    seen = Seen()
    assert (
        supervise(
            [sys.executable, "-c", f"print({_step(1)!r})"],
            log_path=steps_log,
            log_steps_only=True,
            append=True,
        )
        == 0
    )
    started = time.monotonic()
    with pytest.raises(StepCheckError) as info:
        supervise(
            _verl("noise", _step(1), _step(2, in_loss=12), _step(3)),
            on_step=seen.check,
            on_line=seen.line,
            log_path=steps_log,
            log_steps_only=True,
            append=True,
        )
    assert 1.0 <= time.monotonic() - started < 30
    assert str(info.value) == (
        f"step 2: observation tokens in loss 12; verl stopped at step 2 (log: {steps_log})"
    )
    assert seen.steps == [1, 2]
    assert "noise\n" in seen.lines
    assert [line.split(" - ")[0][-6:] for line in steps_log.read_text().splitlines()] == [
        "step:1",
        "step:1",
        "step:2",
    ]
    assert _gone(*seen.pids())


def test_a_run_past_its_time_limit_is_stopped_whole_and_ends_124(tmp_path: Path, monkeypatch) -> None:
    """The CPU runs' limit: verl (and its group) stopped TIMEOUT_GRACE_S after the limit, its full log kept, each
    line written anew (not appended), the environment given added to this process's."""
    monkeypatch.setattr(supervisor, "TIMEOUT_GRACE_S", 1.0)
    log_path = tmp_path / "train.log"
    log_path.write_text("an earlier invocation's log\n")
    seen = Seen()
    started = time.monotonic()
    code = supervise(
        _verl(_step(1), "ENV:SUPERVISED", "ENV:PATH"),
        on_step=seen.check,
        on_line=seen.line,
        log_path=log_path,
        env={"SUPERVISED": "yes"},
        timeout_s=2.0,
        label="1",
    )
    assert code == TIMED_OUT
    assert 3.0 <= time.monotonic() - started < 30
    assert seen.steps == [1]
    text = log_path.read_text()
    assert text == "".join(seen.lines) and "earlier" not in text
    assert seen.lines[-2:] == ["yes\n", os.environ["PATH"] + "\n"]  # added to this process's environment
    assert _gone(*seen.pids())


def test_verls_own_exit_code_is_returned_and_the_error_class_is_the_callers(
    tmp_path: Path, monkeypatch
) -> None:
    """A run that ends on its own returns verl's code; the CPU runs raise SmokeCheckError, naming the invocation."""
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 1.0)
    failing = [sys.executable, "-c", "import sys; print('step:1 - a:1.0', flush=True); sys.exit(3)"]
    assert supervise(failing, on_step=lambda row: [], timeout_s=60) == 3
    log_path = tmp_path / "train.log"
    with pytest.raises(
        SmokeCheckError, match=r"^bad; verl stopped at step 1 \(invocation 2 \(resumed\), log: "
    ):
        supervise(
            _verl(_step(1)),
            on_step=lambda row: ["bad"],
            log_path=log_path,
            label="2 (resumed)",
            error=SmokeCheckError,
        )
    assert "step:1" in log_path.read_text()  # flushed before the check ran


def test_an_exception_in_a_hook_stops_verl_too(tmp_path: Path, monkeypatch) -> None:
    """Whatever ends the supervision early (here a hook that raises; Ctrl-C alike) leaves no verl training on."""
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 1.0)
    seen = Seen()

    def line_then_fail(line: str) -> None:
        seen.line(line)
        if line.startswith("pids "):
            raise RuntimeError("a hook failed")

    with pytest.raises(RuntimeError, match="a hook failed"):
        supervise(_verl(_step(1)), on_line=line_then_fail)
    assert _gone(*seen.pids())


def test_verl_stops_on_sigint_even_when_this_process_ignores_it(monkeypatch) -> None:
    """A CLI started as a background job inherits SIGINT ignored; verl must not (supervisor._interruptible): a
    verl that keeps Python's own SIGINT handling ends at the timeout's SIGINT, well within the grace."""
    import signal

    monkeypatch.setattr(supervisor, "TIMEOUT_GRACE_S", 20.0)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        code = supervise(
            [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], timeout_s=2.0
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == TIMED_OUT
    assert time.monotonic() - started < 15  # the SIGINT ended it, not SIGKILL after the 20 s grace
