"""verl's sync replay buffer, plus two things: a failed rollout group stops the run, and each step logs `search/*`.

Set by trainer/overrides.py as `trainer.v1.sampler.custom_sampler.{path,name}` (verl/trainer/ppo/v1/
trainer_base.py:145-151), with `trainer.v1.trainer_mode=sync`. The mode name matters: verl compares it with the
literal "sync" (trainer_base.py:153, 731, 902, 1004, 1499), so any other name (we used `searchrl_sync` for a
registered trainer subclass) silently switches on the async replay buffer, a one-row dataloader and checkpoints
that also save every step's trajectories.

**Failures stop the run.** In verl 0.9.1 the reward function and the tools run inside the agent-loop worker,
which catches any exception, logs it and marks the prompt's group "failure" (agent_loop_tq.py:133-148). The sync
buffer then trains on fewer trajectories without a metric, or, once every group fails (a reward that raises
SearchFailureRateError on every call does exactly that), refills forever or dies with "no materializable
trajectories" and without the cause. So `_sync_metadata_from_transfer_queue`, which the buffer runs on every
poll, raises `RolloutFailedError` the first time a group is marked "failure": the trainer's `fit` ends, main_ppo
exits non-zero, and `searchrl train` prints the first error the worker logged (trainer/run_log.py).

**Search metrics.** `sample()` returns (batch, metrics) and the trainer adds those metrics to the step's
(trainer_base.py:567-572), so the search tool's per-trajectory counters (extra_fields, trainer/tool.py) become
the step's `search/*` metrics (trainer/metrics.py) in verl's tracker: console, and W&B with WANDB_API_KEY.
"""

from __future__ import annotations

import logging
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from searchrl.errors import RolloutFailedError
from searchrl.trainer.metrics import search_step_metrics

log = logging.getLogger(__name__)

TRAIN_PARTITION = "train"


class SearchReplayBuffer(ReplayBuffer):
    """ReplayBuffer (sync) that raises on a failed group and adds `search/*` to each training step's metrics."""

    def _sync_metadata_from_transfer_queue(self) -> None:
        super()._sync_metadata_from_transfer_queue()
        failed = {partition: sorted(keys) for partition, keys in self.failure_keys.items() if keys}
        if failed:
            groups = ", ".join(f"{len(keys)} in {partition}" for partition, keys in sorted(failed.items()))
            raise RolloutFailedError(
                f"rollout groups failed ({groups}): the agent-loop worker caught an exception from the reward "
                "function or a tool (its traceback is in the worker log above); stopping instead of training on "
                "fewer trajectories"
            )

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == TRAIN_PARTITION:
            metrics = {**metrics, **search_step_metrics(search_extra_fields(batch))}
        return batch, metrics


def search_extra_fields(batch: Any) -> list[Any]:
    """The batch's trajectories' extra_fields from TransferQueue, padding rows (verl's filler) left out."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    rows = list(data.pop("extra_fields").tolist())
    padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    return [row for row, pad in zip(rows, padding, strict=True) if not pad]


__all__ = ["SearchReplayBuffer", "search_extra_fields"]
