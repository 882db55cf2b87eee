"""Merge the newest FSDP checkpoint of a run into a Hugging Face model folder, and prove it loads.

Run: `searchrl train merge` (settings give the run folder, <checkpoint_dir>/<experiment_name>) or
`searchrl train merge --run-dir checkpoints/my-run --target-dir models/my-run`.

verl writes `<run>/latest_checkpointed_iteration.txt` only after a checkpoint is complete, so the step named there
is the newest usable one (a newer `global_step_N` folder may be half-written by a preempted job). Waits first,
then reads: on a multi-node run the tracker, rank 0's `fsdp_config.json` and `huggingface/` and every rank's
shards reach the merging node's view of the bucket on other nodes' upload schedules (verl places rank 0 by
sorting node IPs as strings, not on the head), so anything missing is "not yet" until the `--wait` deadline
(trainer/checkpoint.py). The merge
itself is verl's: `python -m verl.model_merger merge --backend fsdp --local_dir <run>/global_step_N/actor
--target_dir <out>`; then the output is loaded with transformers (config, tokenizer, weights) before we call it
done.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from searchrl.errors import CheckpointError

log = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
HF_CONFIG = "huggingface/config.json"  # rank 0 writes it beside fsdp_config.json; verl's merger reads it


@dataclass(frozen=True)
class MergeResult:
    step: int
    actor_dir: Path
    target_dir: Path
    num_parameters: int | None  # None when verification was skipped


def find_latest_checkpoint(run_dir: Path) -> tuple[int, Path]:
    """(step, <run>/global_step_N/actor) for the step named in the tracker file."""
    tracker = run_dir / TRACKER_FILE
    if not tracker.is_file():
        raise CheckpointError(
            f"no {TRACKER_FILE} in {run_dir}: no finished checkpoint yet (verl writes one every save_freq steps); "
            "pass the run folder, i.e. <checkpoint_dir>/<experiment_name>"
        )
    text = tracker.read_text().strip()
    try:
        step = int(text)
    except ValueError:
        raise CheckpointError(f"{tracker} holds {text[:40]!r}, not a step number") from None
    actor_dir = run_dir / f"global_step_{step}" / "actor"
    if not (actor_dir / "fsdp_config.json").is_file():
        raise CheckpointError(
            f"{tracker} names step {step} but {actor_dir} has no fsdp_config.json (deleted or not an FSDP checkpoint)"
        )
    return step, actor_dir


def run_verl_merger(actor_dir: Path, target_dir: Path, python: str = sys.executable) -> None:
    """verl's own merger in a subprocess (it parses its own argv and prints progress)."""
    cmd = [
        python, "-m", "verl.model_merger", "merge",
        "--backend", "fsdp",
        "--local_dir", str(actor_dir),
        "--target_dir", str(target_dir),
    ]  # fmt: skip
    log.info("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise CheckpointError(
            f"verl.model_merger failed with exit code {proc.returncode} for {actor_dir} (log above)"
        )


def verify_hf_model(target_dir: Path) -> int:
    """Load config, tokenizer (if saved) and weights with transformers; return the parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        AutoConfig.from_pretrained(target_dir)
        if any(target_dir.glob("tokenizer*")):
            AutoTokenizer.from_pretrained(target_dir)
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"merged model in {target_dir} does not load with transformers: {exc}") from exc
    return sum(p.numel() for p in model.parameters())


def merge_latest(
    run_dir: Path, target_dir: Path | None = None, *, verify: bool = True, wait_s: float = 0.0
) -> MergeResult:
    """Merge the newest finished checkpoint of `run_dir` (default output: <run>/merged/global_step_N).

    Within one `wait_s` budget: waits for the tracker file and re-reads it until its step can be trusted, then
    for that step's `fsdp_config.json`, `huggingface/config.json` (what verl's merger reads) and every rank's
    shard (trainer/checkpoint.py); only past the deadline does a missing one become an error.
    """
    import time

    from searchrl.trainer.checkpoint import wait_for_checkpoint, wait_for_tracker

    run_dir = run_dir.expanduser().resolve()
    if not run_dir.is_dir():  # a wrong path, not a slow upload: the launch wrote <run>/searchrl/ on this node
        raise CheckpointError(
            f"no {TRACKER_FILE} in {run_dir}: the folder does not exist; pass the run folder, i.e. "
            "<checkpoint_dir>/<experiment_name>"
        )
    started = time.monotonic()  # one budget for both waits
    step = wait_for_tracker(run_dir, deadline_s=wait_s, started_at=started)
    actor_dir = run_dir / f"global_step_{step}" / "actor"
    wait_for_checkpoint(actor_dir, deadline_s=wait_s, require=(HF_CONFIG,), started_at=started)
    target = (target_dir or run_dir / "merged" / f"global_step_{step}").expanduser().resolve()
    run_verl_merger(actor_dir, target)
    n_params = verify_hf_model(target) if verify else None
    if n_params is not None:
        log.info("merged step %d into %s (%d parameters; loads with transformers)", step, target, n_params)
    return MergeResult(step=step, actor_dir=actor_dir, target_dir=target, num_parameters=n_params)


__all__ = [
    "HF_CONFIG",
    "TRACKER_FILE",
    "MergeResult",
    "find_latest_checkpoint",
    "merge_latest",
    "run_verl_merger",
    "verify_hf_model",
]
