"""Is a verl FSDP checkpoint complete, with every rank's shard? Wait for it with a deadline, or refuse.

Used by `searchrl train merge` and by `searchrl train local` before verl resumes. Why it is needed: on a
multi-node run each node writes its own ranks' shards (`model|optim|extra_state_world_size_W_rank_R.pt`) to a
MOUNT_CACHED bucket, and each node's rclone uploads them on its own schedule. verl's rank 0 writes
`latest_checkpointed_iteration.txt` after a barrier on *local* writes, so the head (merging) or a new node
(resuming after preemption) can read the tracker before a worker's shards reach the bucket, or find a shard cut
short by a node that died mid-upload. A checkpoint is complete when `fsdp_config.json` names the world size W
and, for every kind rank 0 saved, ranks 0..W-1 each have a shard whose zip end record is intact: `torch.save`
writes a zip archive whose central directory sits at the end, so a truncated file has none
(https://pytorch.org/docs/stable/notes/serialization.html).
"""

from __future__ import annotations

import json
import logging
import re
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.errors import CheckpointError

# Our record of a run, inside its run folder next to verl's global_step_N folders: the settings a resume must match
# (settings.json) and verl's `step:N - ...` console lines of every invocation (STEPS_LOG). Written by launch, read by
# the smoke checks and the resume's probability-diff watch; here, below both, so neither imports the other.
RECORD_DIR = "searchrl"
STEPS_LOG = "steps.log"

log = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl: checkpoint_manager.get_checkpoint_tracker_filename
# Seconds between polls: longer than rclone's 10 s directory cache (SkyPilot mounts with `--dir-cache-time 10s`),
# so each poll sees what other nodes have uploaded since the last one.
POLL_INTERVAL_S = 15.0
# How long the tracker file is re-read before its step is trusted: three polls, so a value read through a stale
# directory cache (the node whose rank 0 wrote it uploads on its own schedule) is replaced by the newer one.
TRACKER_SETTLE_S = 30.0
_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


@dataclass(frozen=True)
class Shard:
    kind: str  # model | optim | extra_state
    rank: int
    path: Path
    size: int  # bytes on this node's view of the bucket


@dataclass
class CheckpointState:
    """What one `<run>/global_step_N/actor` folder holds right now."""

    actor_dir: Path
    world_size: int | None
    shards: list[Shard] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # empty = complete

    @property
    def complete(self) -> bool:
        return not self.problems

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


def shard_problem(path: Path) -> str | None:
    """None if `path` is a whole `torch.save` archive; otherwise why not (missing, empty, cut short)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size == 0:
        return "empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as archive:
            if not archive.namelist():
                return f"short ({size} bytes, an empty archive)"
    except (zipfile.BadZipFile, OSError):
        return f"short ({size} bytes, no zip end record: cut off while writing or uploading)"
    return None


def inspect_checkpoint(actor_dir: Path, require: tuple[str, ...] = ()) -> CheckpointState:
    """Check every rank's shard of one checkpoint (see the module docstring for what complete means).

    `require` names more files (relative to `actor_dir`) that must be there, e.g. `huggingface/config.json`,
    which verl's merger reads and rank 0 writes beside `fsdp_config.json` (fsdp_checkpoint_manager.py:364-410).
    """
    config_path = actor_dir / "fsdp_config.json"
    missing = [
        f"{actor_dir / name} missing (rank 0 has not saved it)"
        for name in require
        if not (actor_dir / name).is_file()
    ]
    try:
        world_size = int(json.loads(config_path.read_text())["world_size"])
    except FileNotFoundError:
        return CheckpointState(
            actor_dir, None, problems=[f"{config_path} missing (rank 0 has not saved)", *missing]
        )
    except (ValueError, KeyError, TypeError):
        return CheckpointState(actor_dir, None, problems=[f"{config_path} has no world_size"])
    state = CheckpointState(actor_dir, world_size)
    present = {m.group(1) for p in actor_dir.glob("*.pt") if (m := _SHARD.match(p.name))}
    kinds = sorted(
        present | {"model"}
    )  # the model shards are always needed; optim/extra if rank 0 saved them
    for kind in kinds:
        for rank in range(world_size):
            path = actor_dir / f"{kind}_world_size_{world_size}_rank_{rank}.pt"
            problem = shard_problem(path)
            if problem is None:
                state.shards.append(Shard(kind, rank, path, path.stat().st_size))
            else:
                state.problems.append(f"rank {rank} {kind} shard {path.name} is {problem}")
    state.problems.extend(missing)
    return state


def wait_for_checkpoint(
    actor_dir: Path,
    *,
    deadline_s: float,
    interval_s: float | None = None,
    require: tuple[str, ...] = (),
    started_at: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> CheckpointState:
    """Poll until every rank's shard (and each `require`d file) is there and whole; past `deadline_s`, raise one
    CheckpointError line. Polls every `interval_s` (default POLL_INTERVAL_S), the last one at the deadline;
    `started_at` (a `clock()` value) counts an earlier part of the same wait.
    """
    interval = POLL_INTERVAL_S if interval_s is None else interval_s
    start = clock() if started_at is None else started_at
    while True:
        state = inspect_checkpoint(actor_dir, require)
        if state.complete:
            log.info(
                "checkpoint %s complete: %d shards of world size %s, %.2f GB",
                actor_dir,
                len(state.shards),
                state.world_size,
                state.total_bytes / 1e9,
            )
            return state
        waited = clock() - start
        if waited >= deadline_s:
            more = f" (+{len(state.problems) - 1} more)" if len(state.problems) > 1 else ""
            raise CheckpointError(
                f"checkpoint {actor_dir} incomplete after {deadline_s:.0f}s: {state.problems[0]}{more}; "
                "a node that wrote it did not upload all of its shards"
            )
        log.info(
            "waiting for checkpoint %s: %s%s; waited %.0fs of %.0fs",
            actor_dir,
            state.problems[0],
            f" (+{len(state.problems) - 1} more)" if len(state.problems) > 1 else "",
            waited,
            deadline_s,
        )
        sleep(min(interval, deadline_s - waited))


def wait_for_tracker(
    run_dir: Path,
    *,
    deadline_s: float,
    settle_s: float | None = None,
    interval_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    started_at: float | None = None,
) -> int:
    """The step verl's tracker file names, once it has been there and been re-read for `settle_s`.

    On a multi-node run the tracker is written on the node where verl's trainer process runs, which Ray places
    anywhere, and reaches this node's view of the bucket after that node's rclone upload and this node's 10 s
    directory cache: a missing tracker is "not yet" until `deadline_s`, and the first value read may be the
    previous save's. It is re-read every `interval_s` for `settle_s` (default TRACKER_SETTLE_S, never past the
    deadline) and the newest step seen wins (verl only moves it forward).
    """
    interval = POLL_INTERVAL_S if interval_s is None else interval_s
    settle = min(TRACKER_SETTLE_S if settle_s is None else settle_s, deadline_s)
    start = clock() if started_at is None else started_at
    best: int | None = None
    first_seen: float | None = None
    problem = f"no {TRACKER_FILE} in {run_dir}"
    while True:
        try:
            step = latest_step(run_dir)
        except CheckpointError as exc:  # half-written through the mount: not yet
            step, problem = None, str(exc)
        now = clock() - start
        if step is not None:
            best = step if best is None else max(best, step)
            first_seen = now if first_seen is None else first_seen
        if best is not None and first_seen is not None and (now - first_seen >= settle or now >= deadline_s):
            return best
        if best is None and now >= deadline_s:
            raise CheckpointError(
                f"{problem} after waiting {deadline_s:.0f}s: no finished checkpoint yet (verl writes one every "
                "save_freq steps); pass the run folder, i.e. <checkpoint_dir>/<experiment_name>"
            )
        if best is None:
            log.info("waiting for %s: %s; waited %.0fs of %.0fs", TRACKER_FILE, problem, now, deadline_s)
            sleep(min(interval, deadline_s - now))
        else:
            sleep(min(interval, (first_seen or 0.0) + settle - now, deadline_s - now))


def latest_step(run_dir: Path) -> int | None:
    """The step verl's tracker file names, or None when the run has no checkpoint yet."""
    tracker = run_dir / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{tracker} holds {text[:40]!r}, not a step number") from None


def newest_complete_step(run_dir: Path, below: int) -> int | None:
    """The newest global_step_N (N < below) whose checkpoint is complete now: where a resume falls back to."""
    names = [p.name.removeprefix("global_step_") for p in run_dir.glob("global_step_*")]
    for step in sorted((int(n) for n in names if n.isdigit()), reverse=True):
        if step < below and inspect_checkpoint(run_dir / f"global_step_{step}" / "actor").complete:
            return step
    return None


def check_resume(run_dir: Path, *, deadline_s: float, **wait: object) -> int | None:
    """The step to resume from: the tracker's, once complete, else the newest complete one; None = fresh start.

    The newest checkpoint can stay incomplete for good: a node died before its rclone flushed its shards, or the
    head failed and SkyPilot cancelled the workers before their flush. Refusing would stop a recovering run for
    a checkpoint that cannot appear (and a managed job restarts into the same refusal), so after waiting
    `deadline_s` for the missing shards this falls back to the newest complete step, with a warning naming
    both: the steps after it are trained again. The caller points verl at that step (verl's `resume_mode=auto`
    would load the tracker's). Only a run with no complete checkpoint at all is refused.
    """
    step = latest_step(run_dir)
    if step is None:
        return None
    try:
        wait_for_checkpoint(run_dir / f"global_step_{step}" / "actor", deadline_s=deadline_s, **wait)  # type: ignore[arg-type]
    except CheckpointError as exc:
        older = newest_complete_step(run_dir, step)
        if older is None:
            raise CheckpointError(
                f"not resuming: {exc}; no earlier complete step exists in {run_dir}: start fresh with another "
                "EXPERIMENT_NAME (or restore the missing shards)"
            ) from None
        log.warning(
            "step %d in %s is incomplete (%s): resuming from step %d, the newest complete one; steps %d-%d are "
            "trained again",
            step,
            run_dir,
            exc,
            older,
            older + 1,
            step,
        )
        return older
    log.info("resuming from step %d in %s", step, run_dir)
    return step


__all__ = [
    "POLL_INTERVAL_S",
    "RECORD_DIR",
    "STEPS_LOG",
    "TRACKER_FILE",
    "TRACKER_SETTLE_S",
    "CheckpointState",
    "Shard",
    "check_resume",
    "inspect_checkpoint",
    "latest_step",
    "newest_complete_step",
    "shard_problem",
    "wait_for_checkpoint",
    "wait_for_tracker",
]
