"""The one supervisor of verl's trainer, for GPU and CPU runs alike: `python -m verl.trainer.main_ppo` as a child
process, every line of its output handed to an on-line hook and each `step:N - ...` line, parsed, to an on-step
check, whose first problem stops verl at that step.

- `searchrl train local` (trainer/launch.py): verl's output passed through to the terminal, its step lines
  appended to <run>/searchrl/steps.log across invocations, each step held to the GPU limits
  (trainer/step_checks.py `gpu_step_problems`); no time limit.
- the CPU proof runs (trainer/proofs/train_cpu.py `run_main_ppo`): the whole output in a log file per invocation,
  one line per phase of verl's start-up (trainer/verl_progress.py) and per step, the CPU plugin's environment
  (trainer/cpu/plugin.py ENV, passed in: a GPU-run module imports neither trainer/cpu nor trainer/proofs), a
  time limit.

Stopping at the first bad step is what it is for: a run that trains on tool responses in its loss, or samples from
stale weights, costs the steps up to that one, not hours more. verl runs in a session of its own, so stopping it
(searchrl/processes.py `stop_process`) takes Ray's processes and everything else it started with it; it gets SIGINT
first, so that Python's atexit runs `ray.shutdown` for the Ray it started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from searchrl.errors import SearchRLError, StepCheckError
from searchrl.processes import stop_process
from searchrl.trainer.step_checks import StepCheck, parse_steps
from searchrl.trainer.step_lines import StepLines

log_ = logging.getLogger(__name__)  # `log` below is the run's log file

# After a failed step check (or any other end of the supervision but verl's own) verl gets SIGINT and this long to
# exit before its whole process group is killed.
STOP_GRACE_S = 30.0
# Past the time limit the run has spent its budget already: SIGINT, then this long.
TIMEOUT_GRACE_S = 5.0
TIMED_OUT = 124  # the exit code of a run stopped at its time limit, as timeout(1) reports one


def _interruptible() -> None:
    """Run in verl's process before it starts: SIGINT back to its default action. A shell starts a background job
    (`nohup ... &`, a CI runner's) with SIGINT ignored, children inherit an ignored signal, and Python then installs
    no KeyboardInterrupt handler: verl ignored the SIGINT that stops it, ran on for the whole grace and was killed
    past its atexit, Ray left running (found when a CI run started as a background job, tests/test_processes.py)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def supervise(
    command: Sequence[str],
    *,
    on_step: StepCheck | None = None,
    on_line: Callable[[str], object] | None = None,
    log_path: Path | None = None,
    log_steps_only: bool = False,
    append: bool = False,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    label: str = "",
    error: type[SearchRLError] = StepCheckError,
) -> int:
    """Run `command` (verl) to its end; its exit code, or TIMED_OUT when it ran past `timeout_s`.

    Each line of its output (stderr included) goes to `on_line` and into `log_path` (with `log_steps_only`, only
    the step lines, whole: trainer/step_lines.py; appended to with `append`, else written anew). Each step line,
    put back together where Ray forwarded it in pieces, becomes a StepRow of run `label` and, the log flushed, goes
    to `on_step`, which returns the step's problems: the first step with any stops verl
    and raises `error`, one line naming the problems, the step, the invocation `label` and the log. `env` is added to
    this process's environment. Whatever else ends the supervision early (an exception in a hook, Ctrl-C) stops verl
    too: it never trains on unwatched.
    """
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=None if env is None else {**os.environ, **env},
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: stopping verl stops every process it started
        preexec_fn=_interruptible,
    )
    assert proc.stdout is not None
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        stop_process(proc, TIMEOUT_GRACE_S, sig=signal.SIGINT)

    timer = threading.Timer(timeout_s, expire) if timeout_s is not None else None
    if timer is not None:
        timer.start()
    try:
        with _open_log(log_path, append) as log:

            def check(ready: str) -> None:
                for row in parse_steps(ready, label):
                    if log is not None:
                        if log_steps_only:
                            log.write(ready + "\n")
                        log.flush()
                    problems = on_step(row) if on_step is not None else []
                    if problems:
                        where = [f"invocation {label}"] if label else []
                        where += [f"log: {log_path}"] if log_path is not None else []
                        raise error(
                            f"{'; '.join(problems)}; verl stopped at step {row.step}"
                            + (f" ({', '.join(where)})" if where else "")
                        )

            lines = StepLines()
            for line in proc.stdout:
                if log is not None and not log_steps_only:
                    log.write(line)
                if on_line is not None:
                    on_line(line)
                was_marked = lines.marked
                for ready in lines.feed(line):
                    check(ready)
                if was_marked and lines.unmarked:
                    log_.warning(
                        "verl's step lines carry no end marker (trainer/patches/step_line.py is not in "
                        "VERL_USE_EXTERNAL_MODULES): each is read as it arrives, so one Ray forwards in pieces "
                        "is read cut"
                    )
            for ready in lines.flush():
                check(ready)
        code = proc.wait()
    except BaseException:
        stop_process(proc, STOP_GRACE_S, sig=signal.SIGINT)
        raise
    finally:
        if timer is not None:
            timer.cancel()
    return TIMED_OUT if timed_out.is_set() else code


def _open_log(path: Path | None, append: bool) -> contextlib.AbstractContextManager[IO[str] | None]:
    if path is None:
        return contextlib.nullcontext()
    return open(path, "a" if append else "w", encoding="utf-8")


__all__ = ["STOP_GRACE_S", "TIMED_OUT", "TIMEOUT_GRACE_S", "supervise"]
