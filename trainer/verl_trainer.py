"""verl's synchronous PPO trainer plus the `search/*` metrics of each step (trainer/metrics.py).

verl 0.9.1 runs the V1 trainer (`trainer.use_v1=True` is its default) and picks the class by name from its
registry: `trainer.v1.trainer_mode=sync` is `PPOTrainerSync`. Its per-step metrics are a fixed set; the
search tool's counters travel with every sample (`extra_fields` in TransferQueue) but are never logged for a
training step. `SearchMetricsTrainer` is `PPOTrainerSync` with one addition: after verl computes a step's
metrics it reads the same samples' `extra_fields` (the call verl itself makes for speculative-decoding stats)
and adds `search_step_metrics(...)`, so `Tracking.log` sends them with everything else, to the console and to
W&B when `trainer.logger` has `wandb` (TrainSettings.logger "auto": only when WANDB_API_KEY is set).

verl looks the name up inside its TaskRunner, a Ray actor that never imports our code, so the overrides
(trainer/overrides.py) also set Ray's `worker_process_setup_hook` to `register` below: every Ray worker of
the job imports this module, which registers the class, before it runs anything.

    trainer.v1.trainer_mode=searchrl_sync
    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=searchrl.trainer.verl_trainer.register
"""

from __future__ import annotations

import logging
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from searchrl.trainer.metrics import search_step_metrics
from searchrl.trainer.overrides import SETUP_HOOK, TRAINER_MODE

log = logging.getLogger(__name__)


@register_trainer(TRAINER_MODE)
class SearchMetricsTrainer(PPOTrainerSync):
    """PPOTrainerSync whose per-step metrics include the search tool's (`search/*`)."""

    def _compute_metrics(
        self, batch: Any, metrics: dict[str, Any], timing_raw: Any, global_steps: int, epoch: int
    ) -> None:
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        metrics.update(search_step_metrics(self._search_extra_fields(batch)))

    @staticmethod
    def _search_extra_fields(batch: Any) -> list[Any]:
        """The step's trajectories' extra_fields, padding rows (verl's batch-size filler) left out."""
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        rows = list(data.pop("extra_fields").tolist())
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        return [row for row, pad in zip(rows, padding, strict=True) if not pad]


def register() -> None:
    """Ray's worker_process_setup_hook: importing this module registered the trainer; say so once per worker."""
    log.debug("verl trainer %r registered (%s)", TRAINER_MODE, SearchMetricsTrainer.__name__)


__all__ = ["SETUP_HOOK", "TRAINER_MODE", "SearchMetricsTrainer", "register"]
