"""The checks after a smoke run (`make train-smoke`, SMOKE=1): did the pipeline do what a real run needs?

A smoke run that exits 0 proves little: the model may never have called the tool, or no checkpoint may exist.
So after verl returns, `searchrl train local` with SMOKE=1 checks, and fails with one line naming what is missing:
  1. at least one search happened: verl's rollout dumps (`trainer.rollout_data_dir` = <run>/rollouts, one
     `<step>.jsonl` per step) carry our reward's `search_calls` for every trajectory (trainer/plugins/reward.py);
  2. a checkpoint was written for the last step (verl's `latest_checkpointed_iteration.txt`);
  3. verl's merger turns it into a Hugging Face folder, and that folder loads with transformers (trainer/merge.py);
  4. every step verl logged (<run>/searchrl/steps.log, kept by `searchrl train local`) is within verl's FAQ limit
     for the rollout/actor probability difference (a mean >= 0.01 on 3 steps in a row, or one step >= 0.05,
     fails; `ProbDiffWatch`), trained on no
     tool-response token, saw one where it searched, and logged every figure these need (trainer/step_checks.py
     `gpu_step_problems`). The mean difference is no weight-sync check in bf16; the fingerprint is, inside verl
     (trainer/weight_sync/vllm_sync.py, vLLM only; not sglang).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from searchrl.errors import CheckpointError, SmokeCheckError
from searchrl.trainer.checkpoint import RECORD_DIR, STEPS_LOG
from searchrl.trainer.merge import MergeResult, find_latest_checkpoint, merge_latest
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.step_checks import ProbDiffWatch, gpu_step_problems, parse_steps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SmokeReport:
    trajectories: int
    searches: int
    failed_searches: int
    checkpoint_step: int
    merged: MergeResult

    def summary(self) -> str:
        return (
            f"{self.searches} searches ({self.failed_searches} failed) in {self.trajectories} trajectories, "
            f"checkpoint at step {self.checkpoint_step}, merged into {self.merged.target_dir} "
            f"({self.merged.num_parameters} parameters)"
        )


def count_searches(rollout_dir: Path) -> tuple[int, int, int]:
    """(trajectories, searches, failed searches) over every `<step>.jsonl` verl dumped."""
    files = sorted(rollout_dir.glob("*.jsonl")) if rollout_dir.is_dir() else []
    if not files:
        raise SmokeCheckError(
            f"no rollout dumps in {rollout_dir}: verl wrote none (is trainer.rollout_data_dir set? SMOKE=1 sets it)"
        )
    trajectories = searches = failed = 0
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            trajectories += 1
            searches += int(row.get("search_calls") or 0)
            failed += int(row.get("search_failures") or 0)
    return trajectories, searches, failed


def check_steps_log(path: Path) -> int:
    """Check 4 on verl's step lines; returns how many steps were checked."""
    rows = parse_steps(path.read_text(encoding="utf-8", errors="replace"), "gpu") if path.is_file() else []
    if not rows:
        raise SmokeCheckError(
            f"no step lines in {path}: verl logged no training step (is trainer.logger console?)"
        )
    watch = ProbDiffWatch()
    for row in rows:
        failures, warnings = gpu_step_problems(row, watch)
        if failures:
            raise SmokeCheckError(failures[0])
        for warning in warnings:
            log.warning("%s", warning)
    log.info("%s", watch.summary())
    return len(rows)


def check_smoke_run(settings: TrainSettings) -> SmokeReport:
    """Checks 1-4 of the module docstring on settings.run_dir; raise SmokeCheckError naming the first miss."""

    run_dir = settings.run_dir.expanduser().resolve()
    trajectories, searches, failed = count_searches(run_dir / "rollouts")
    if searches == 0:
        raise SmokeCheckError(
            f"the model never called the search tool in {trajectories} trajectories ({run_dir / 'rollouts'}): "
            "check the tool config (searchrl train tool-config) and that rollout.multi_turn is on (searchrl train "
            "overrides)"
        )
    if failed == searches:
        raise SmokeCheckError(
            f"all {searches} searches failed: the retrieval service never answered the rollout workers "
            "(RETRIEVAL_SERVICE_URL, RETRIEVAL_API_KEY on every node)"
        )
    try:
        step, _ = find_latest_checkpoint(run_dir)
    except CheckpointError as exc:
        raise SmokeCheckError(f"no checkpoint after the smoke run: {exc}") from None
    if step < settings.total_steps:
        raise SmokeCheckError(
            f"the newest checkpoint is step {step}, not the last step {settings.total_steps}: verl stopped early"
        )
    try:
        merged = merge_latest(run_dir, verify=True)
    except CheckpointError as exc:
        raise SmokeCheckError(f"the smoke checkpoint does not merge into a loadable model: {exc}") from None
    check_steps_log(run_dir / RECORD_DIR / STEPS_LOG)
    return SmokeReport(trajectories, searches, failed, step, merged)


__all__ = ["SmokeReport", "check_smoke_run", "check_steps_log", "count_searches"]
