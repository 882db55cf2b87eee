"""Run one step of a managed job; the same failure of a step twice in a row stops the job instead of restarting it.

    python3 trainer/node/refusal.py --state DIR -- searchrl train data
    python3 trainer/node/refusal.py --state DIR --run-dir RUN -- searchrl train local   # progress = RUN's checkpoints
    python3 trainer/node/refusal.py --state DIR --check       # exit 78 (and say why) if this job was stopped, else 0
    python3 trainer/node/refusal.py --state DIR --stopped     # exit 0 (and say why) if this job was stopped, else 1

Why: with `job_recovery.max_restarts_on_errors: 3`, SkyPilot restarts a managed job on every non-zero exit, and it
has no setting that exempts an exit code (0.14.1's `recover_on_exit_codes` does the opposite: those codes restart
without limit). Each restart re-installs the lock, prepares data and starts Ray on 2 x 8 H100, so a failure that
will happen again costs that much each time for nothing. The first failure of a step exits as usual (one restart:
a transient cause gets its retry); when the next attempt of the same managed job (same $SKYPILOT_TASK_ID, which
SkyPilot keeps across recoveries) fails the same step the same way, with no new checkpoint in between, this marks
the job stopped, says `stopped: ...` and exits 78 (sysexits EX_CONFIG). "The same way" is, by exit code:

- 2 with one `error: ...` line (a searchrl refusal: settings changed under the same EXPERIMENT_NAME, a checkpoint
  that cannot be resumed, a driver too old for the lock, a step check that stopped verl): the same line once
  measured values are masked (`normalise`), so a check that stops every attempt (say the rollout/actor probability
  difference at step 1, a different value each time) ends the job at the second attempt;
- 75 (searchrl's ServiceUnavailableError: the retrieval service unreachable or answering 503 until the step's
  deadline, 2,600 s on the head): any second outage of the step. The first one is restarted (SkyServe may have been
  replacing a replica), the second in a row means nobody is bringing it back;
- anything else (a crash, e.g. a verl traceback): the exit code and the last exception line of the output
  (stdout and stderr: `searchrl train local` passes verl's stderr through its stdout), with pids, addresses,
  hex ids and timestamps normalised (`crash_signature`); Hydra's closing hint is not an exception line.

"No new checkpoint in between": with `--run-dir`, the newest complete checkpoint step of that run (trainer/
checkpoint.py's `newest_complete_step`: every rank's shard whole) is read when the step starts and kept in the
record. It is read at the start, not at the failure, because a failed head's workers upload their shards of the
last checkpoint only after it fails (sky/train.yaml's flush grace): by the next attempt they are in the bucket.
A run that saved a checkpoint since the previous failure keeps its restarts. Without `--run-dir` (setup's steps,
the health check) nothing is trained, so there is no progress to wait for. A step that succeeds clears its record.

The job is then unfinished, and shows so: SkyPilot counts 78 as a failure, and each restart it still grants ends
at the first line of setup (`--check` exits 78 in seconds, on the nodes FAILOVER kept), so the job ends
FAILED_SETUP once max_restarts_on_errors is spent, never SUCCEEDED (0.14.1 has no way to end a job as failed
without using up its restarts). The lines `outage: ...` and `crash: ...` say in `sky jobs logs` what was recorded.

DIR lives in the checkpoint bucket ($CHECKPOINT_DIR/.searchrl-refusals), one JSON record per job and step, so the
record survives re-provisioning. Outside a managed job (no $SKYPILOT_TASK_ID) the command runs unchanged.
Standard library only: setup runs it with the system python before anything is installed; `--run-dir` (used in
`run`, after the venv is active) imports searchrl's checkpoint check when it is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

REFUSAL_EXIT = 2  # searchrl.cli.main(): one `error: ...` line on stderr, exit 2 (searchrl/errors.py)
OUTAGE_EXIT = 75  # searchrl's ServiceUnavailableError (EX_TEMPFAIL): the second one in a row stops the job
STOPPED_EXIT = 78  # this job was stopped after a repeated failure (EX_CONFIG): a failure, never SUCCEEDED

# An exception line as Python prints it last in a traceback (`module.Name: message`, or the bare name), possibly
# behind Ray's log prefix `(TaskRunner pid=123, ip=10.0.0.1)`; Hydra's closing hint is not one.
_RAY_PREFIX = re.compile(r"^\s*\([\w.:-]+ pid=\d+[^)]*\)\s*")
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Fault|Failure|Timeout|Killed)"
    r"(?:\([\w.]*\))?(?::.*)?$"
)
_NOISE = [  # what differs between two runs of the same crash -> a fixed token
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T_]\d{2}[:-]\d{2}[:-]\d{2}(?:[.,_]\d+)*"), "<time>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<addr>"),
    (re.compile(r"\[[0-9a-fA-F:]+\](?::\d+)?"), "<addr>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F-]*\d)(?=[0-9a-fA-F-]*[a-fA-F])[0-9a-fA-F-]{8,}\b"), "<id>"),
    (re.compile(r"\b(pid|tid|port)([=: ]+)\d+", re.IGNORECASE), r"\1\2<n>"),
    # a measured value (0.0123, 1.2e-05): a step check that stops a run again is the same check whatever it
    # measured this time; integers (steps, counts, exit codes) and dotted versions (0.9.1) stay
    (re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])"), "<value>"),
]


def _key() -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in os.environ.get("SKYPILOT_TASK_ID", ""))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    """Best effort: a bucket that cannot be written must not turn a failure into a different one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"refusal guard: cannot write {path}: {exc}", file=sys.stderr)  # noqa: T201


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def normalise(line: str) -> str:
    """`line` with pids, addresses, hex ids, timestamps and measured values replaced, so two runs of one crash
    or one failed check read the same."""
    text = _RAY_PREFIX.sub("", line.strip())
    for pattern, token in _NOISE:
        text = pattern.sub(token, text)
    return " ".join(text.split())


def is_exception_line(line: str) -> bool:
    return bool(_EXCEPTION.match(_RAY_PREFIX.sub("", line.strip())))


def crash_signature(code: int, last_exception: str | None, last_line: str | None) -> str:
    """What two crashes must share to be "the same": the exit code and the last exception line (else the last
    line of output), normalised."""
    line = last_exception if last_exception is not None else (last_line or "")
    return f"exit {code}: {normalise(line)}"


def stopped(state: Path) -> str | None:
    """The reason this managed job was stopped, or None."""
    key = _key()
    return _read(state / f"{key}.stopped") if key else None


def record_path(state: Path, key: str, command: list[str]) -> Path:
    """One record per job and step: `<task id>.<first two words>-<hash of the command>.json`."""
    words = "-".join(Path(w).name for w in command[:3] if not w.startswith("-"))[:40]
    digest = hashlib.sha256("\0".join(command).encode()).hexdigest()[:10]
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in words)
    return state / f"{key}.{slug}-{digest}.json"


def checkpoint_progress(run_dir: Path) -> int | None:
    """The newest complete checkpoint step of `run_dir` (trainer/checkpoint.py decides what complete means)."""
    from searchrl.trainer.checkpoint import newest_complete_step  # the venv's searchrl: `run` only

    return newest_complete_step(run_dir, below=sys.maxsize)


class _Tail:
    """Passes a stream through and keeps its last line and last exception line."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order = 0
        self.last_line: tuple[int, str] | None = None
        self.last_exception: tuple[int, str] | None = None
        self.last_error: str | None = None  # searchrl's one-line refusal, stderr only

    def pump(self, source: IO[str], sink: IO[str], refusals: bool) -> None:
        for line in source:
            sink.write(line)
            sink.flush()
            text = line.strip()
            if not text:
                continue
            with self.lock:
                self.order += 1
                self.last_line = (self.order, text)
                if is_exception_line(text):
                    self.last_exception = (self.order, text)
                if refusals and line.startswith("error: "):
                    self.last_error = text


def _classify(code: int, command: list[str], tail: _Tail) -> tuple[str, str]:
    """(kind, signature) of a failed step: what a repeat must match."""
    shown = " ".join(command)
    if code == REFUSAL_EXIT and tail.last_error is not None:
        return "refusal", f"{shown}: {normalise(tail.last_error)}"
    if code == OUTAGE_EXIT:
        return "outage", f"{shown}: exit {OUTAGE_EXIT}"
    exception = tail.last_exception[1] if tail.last_exception else None
    line = tail.last_line[1] if tail.last_line else None
    return "crash", f"{shown}: {crash_signature(code, exception, line)}"


def _stop_reason(kind: str, signature: str, progress: int | None) -> str:
    since = "" if progress is None else f" (newest complete checkpoint still step {progress})"
    what = {
        "refusal": f"the same refusal as the previous attempt ({signature})",
        "outage": f"the retrieval service was unavailable on two attempts in a row ({signature}); check "
        "`sky serve status` and the service's logs",
        "crash": f"the same crash as the previous attempt with no new checkpoint in between{since} ({signature})",
    }[kind]
    return f"{what}; the job is not finished and every restart left ends here: fix it, then launch again"


def _note(kind: str, command: list[str], code: int, signature: str) -> str | None:
    shown = " ".join(command)
    if kind == "outage":
        return (
            f"outage: `{shown}` exited {code} (service unavailable), not a refusal: SkyPilot restarts the job "
            "(max_restarts_on_errors); a second outage in a row stops it"
        )
    if kind == "crash":
        return (
            f"crash: `{shown}` {signature.removeprefix(shown + ': ')}: SkyPilot restarts the job; the same crash "
            "again with no new checkpoint stops it"
        )
    return None


def run(state: Path, command: list[str], run_dir: Path | None = None) -> int:
    """Run `command`, streaming its output; see the module docstring for what a failure does."""
    key = _key()
    if not key:
        return subprocess.call(command)
    reason = stopped(state)
    if reason is not None:
        print(f"stopped: skipping `{' '.join(command)}`: {reason}", file=sys.stderr)  # noqa: T201
        return STOPPED_EXIT
    progress, known = None, True
    if run_dir is not None:
        try:
            progress = checkpoint_progress(run_dir)
        except Exception as exc:  # noqa: BLE001 - never let the guard's bookkeeping fail the step it guards
            known = False
            print(  # noqa: T201
                f"refusal guard: cannot read the checkpoints in {run_dir} ({type(exc).__name__}: {exc}); a crash "
                "of this attempt will not stop the job",
                file=sys.stderr,
            )
    tail = _Tail()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
    )
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=tail.pump, args=(proc.stdout, sys.stdout, False), daemon=True),
        threading.Thread(target=tail.pump, args=(proc.stderr, sys.stderr, True), daemon=True),
    ]
    for reader in readers:
        reader.start()
    code = proc.wait()
    for reader in readers:
        reader.join()
    record = record_path(state, key, command)
    if code == 0:
        _unlink(record)
        return code
    kind, signature = _classify(code, command, tail)
    current: dict[str, Any] = {"kind": kind, "signature": signature, "progress": progress}
    try:
        previous = json.loads(_read(record) or "null")
    except ValueError:
        previous = None
    if previous == current and known:
        reason = _stop_reason(kind, signature, progress)
        _write(state / f"{key}.stopped", reason)
        print(f"stopped: {reason}", file=sys.stderr)  # noqa: T201
        return STOPPED_EXIT
    # unknown progress never matches the next failure
    _write(record, json.dumps(current) if known else "null")
    note = _note(kind, command, code, signature)
    if note:
        print(note, file=sys.stderr)  # noqa: T201
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, command = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(prog="trainer/node/refusal.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state", required=True, type=Path, help="record folder ($CHECKPOINT_DIR/.searchrl-refusals)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the run's folder: a new complete checkpoint there since the last failure keeps the restarts",
    )
    parser.add_argument(
        "--stopped", action="store_true", help="exit 0 if this managed job was stopped, else 1"
    )
    parser.add_argument(
        "--check", action="store_true", help=f"exit {STOPPED_EXIT} if this managed job was stopped, else 0"
    )
    opts = parser.parse_args(args)
    if opts.check:
        reason = stopped(opts.state)
        if reason is None:
            return 0
        print(f"stopped: {reason}", file=sys.stderr)  # noqa: T201
        return STOPPED_EXIT
    if opts.stopped:
        reason = stopped(opts.state)
        if reason is None:
            return 1
        print(f"stopped: {reason}", file=sys.stderr)  # noqa: T201
        return 0
    if not command:
        parser.error("give the command after --, e.g. -- searchrl train local")
    return run(opts.state, command, opts.run_dir)


if __name__ == "__main__":
    sys.exit(main())
