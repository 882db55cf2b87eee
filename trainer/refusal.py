"""Run one step of a managed job; the same refusal twice in a row stops the job instead of restarting it fully.

    python3 trainer/refusal.py --state DIR -- searchrl train local
    python3 trainer/refusal.py --state DIR --check       # exit 78 (and say why) if this job was stopped, else 0
    python3 trainer/refusal.py --state DIR --stopped     # exit 0 (and say why) if this job was stopped, else 1

Why: with `job_recovery.max_restarts_on_errors: 3`, SkyPilot restarts a managed job on every non-zero exit, and it
has no setting that exempts an exit code (0.14.1's `recover_on_exit_codes` does the opposite: those codes restart
without limit). A searchrl refusal (exit 2 with one `error: ...` line: settings changed under the same
EXPERIMENT_NAME, a checkpoint that cannot be resumed, a driver too old for the lock) is deterministic, so each
restart would re-install the lock, prepare data and start Ray on 2 x 8 H100 only to print the same line. The
first refusal exits 2 as usual (one restart: a transient cause gets its retry); when the next attempt of the same
managed job (same $SKYPILOT_TASK_ID, which SkyPilot keeps across recoveries) refuses with the identical line, this
marks the job stopped, says `stopped: ...` and exits 78 (sysexits EX_CONFIG). The job is then unfinished, and shows
so: SkyPilot counts 78 as a failure, and each restart it still grants ends at the first line of setup (`--check`
exits 78 in seconds, on the nodes FAILOVER kept), so the job ends FAILED_SETUP once max_restarts_on_errors is
spent, never SUCCEEDED (0.14.1 has no way to end a job as failed without using up its restarts).

Never a refusal: an outage (exit 75, searchrl's ServiceUnavailableError: the retrieval service unreachable or
answering 503 until the deadline, e.g. while SkyServe replaces a replica) and a crash (any other non-zero code)
keep SkyPilot's restart and clear the record; the line `outage: ...` says so in `sky jobs logs`.

DIR lives in the checkpoint bucket ($CHECKPOINT_DIR/.searchrl-refusals), so the record survives re-provisioning.
Outside a managed job (no $SKYPILOT_TASK_ID) the command runs unchanged. Standard library only: setup runs it with
the system python before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

REFUSAL_EXIT = 2  # searchrl.cli.main(): one `error: ...` line on stderr, exit 2 (searchrl/errors.py)
OUTAGE_EXIT = 75  # searchrl's ServiceUnavailableError (EX_TEMPFAIL): never counted as a refusal
STOPPED_EXIT = 78  # this job was stopped after a repeated refusal (EX_CONFIG): a failure, never SUCCEEDED


def _key() -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in os.environ.get("SKYPILOT_TASK_ID", ""))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    """Best effort: a bucket that cannot be written must not turn a refusal into a crash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"refusal guard: cannot write {path}: {exc}", file=sys.stderr)  # noqa: T201


def stopped(state: Path) -> str | None:
    """The reason this managed job was stopped, or None."""
    key = _key()
    return _read(state / f"{key}.stopped") if key else None


def run(state: Path, command: list[str]) -> int:
    """Run `command`, streaming its output; see the module docstring for what an exit 2 does."""
    key = _key()
    if not key:
        return subprocess.call(command)
    reason = stopped(state)
    if reason is not None:
        print(f"stopped: skipping `{' '.join(command)}`: {reason}", file=sys.stderr)  # noqa: T201
        return STOPPED_EXIT
    last_error: list[str] = []
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace")

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.startswith("error: "):
                last_error[:] = [line.strip()]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    rc = proc.wait()
    reader.join()
    record = state / f"{key}.refusal"
    if rc == OUTAGE_EXIT:
        print(  # noqa: T201
            f"outage: `{' '.join(command)}` exited {rc} (service unavailable), not a refusal: SkyPilot restarts "
            "the job (max_restarts_on_errors)",
            file=sys.stderr,
        )
    if rc != REFUSAL_EXIT or not last_error:  # success, an outage or a crash: only consecutive refusals count
        try:
            record.unlink()
        except OSError:
            pass
        return rc
    signature = f"{' '.join(command)}: {last_error[0]}"
    if _read(record) == signature:
        reason = (
            f"the same refusal as the previous attempt ({signature}); the job is not finished and every restart "
            "left ends here: fix it, then launch again"
        )
        _write(state / f"{key}.stopped", reason)
        print(f"stopped: {reason}", file=sys.stderr)  # noqa: T201
        return STOPPED_EXIT
    _write(record, signature)
    return rc


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, command = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(prog="trainer/refusal.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state", required=True, type=Path, help="record folder ($CHECKPOINT_DIR/.searchrl-refusals)"
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
    return run(opts.state, command)


if __name__ == "__main__":
    sys.exit(main())
