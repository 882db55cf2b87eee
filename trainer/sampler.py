"""verl's sync replay buffer, plus: a failed rollout group stops the run, and each step logs `search/*` and `loss/*`.

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
exits non-zero; `searchrl train local` passes verl's log through, and the CPU runs print the first error the
worker logged (trainer/cpu_smoke.py `first_error`).

**Search metrics.** `sample()` returns (batch, metrics) and the trainer adds those metrics to the step's
(trainer_base.py:567-572), so the search tool's per-trajectory counters (extra_fields, trainer/tool.py) become
the step's `search/*` metrics (trainer/metrics.py) in verl's tracker: console, and W&B with WANDB_API_KEY.

**Loss-mask metrics.** The same batch's response tokens and loss masks give `loss/observation_tokens_in_loss`,
the tokens inside tool responses that the update would train on (trainer/masks.py; must be 0). The token strings
come from the tokenizer named in `trainer.v1.sampler.sampler_kwargs.tokenizer` (trainer/overrides.py sets the
model path); without one the `loss/*` metrics are left out.
"""

from __future__ import annotations

import logging
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from searchrl.errors import RolloutFailedError
from searchrl.trainer.masks import mask_step_metrics
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

    _tokenizer: Any = None

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == TRAIN_PARTITION:
            metrics = {**metrics, **search_step_metrics(search_extra_fields(batch))}
            tokenizer = self._get_tokenizer()
            if tokenizer is not None:
                rows = [(tokenizer.convert_ids_to_tokens(ids), mask) for ids, mask in response_masks(batch)]
                metrics.update(mask_step_metrics(rows))
        return batch, metrics

    def _get_tokenizer(self) -> Any:
        name = (getattr(self, "sampler_kwargs", None) or {}).get("tokenizer")
        if name and self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(name))
        return self._tokenizer


def search_extra_fields(batch: Any) -> list[Any]:
    """The batch's trajectories' extra_fields from TransferQueue, padding rows (verl's filler) left out."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    rows = list(data.pop("extra_fields").tolist())
    padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    return [row for row, pad in zip(rows, padding, strict=True) if not pad]


def _rows(value: Any) -> list[list[int]]:
    """Per-row integer lists from a TransferQueue field (a jagged nested tensor or a padded one)."""
    return [[int(x) for x in row.tolist()] for row in value.unbind(0)]


def response_masks(batch: Any) -> list[tuple[list[int], list[int]]]:
    """(response token ids, loss mask) of each non-padding trajectory of the batch, as the update sees them."""
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"]
    )
    ids, masks = _rows(data["responses"]), _rows(data["response_mask"])
    padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    return [(i, m) for i, m, pad in zip(ids, masks, padding, strict=True) if not pad]


__all__ = ["SearchReplayBuffer", "response_masks", "search_extra_fields"]
