"""The `update_weights` tap both engine adapters share: record what verl sends, check it, agree across ranks.

verl 0.9.1's vLLM and sglang `ServerAdapter.update_weights` take the same arguments and stream the same named
tensors; only what the rollout can tell us back differs (vLLM's workers print every parameter they hold,
trainer/weight_sync/vllm_sync.py; sglang's server reads back the first rows of each tensor by name,
trainer/weight_sync/sglang_sync.py). So the wrapping is written once here: pass LoRA and delta updates through
unchecked, tap the stream as verl's sender consumes it (`fingerprint.tap_stream`: no second pass over the model),
let verl send and load, run the engine's check on the ranks that can read the rollout, then make every rank agree
(`fingerprint.agree_across_ranks`) so a failure on one stops all within seconds; a rank whose check matched then
prints one `SYNC_MATCH_LINE` (trainer/step_checks.py), which Ray forwards to the run's log, where a run counts its
checked syncs (`step_checks.checks_line`). An engine adapter says only what it keeps per tensor, which rank
checks, and how.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

import torch

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync.fingerprint import agree_across_ranks, tap_stream
from searchrl.trainer.weight_sync.match_line import sync_match_line

Kept = TypeVar("Kept")

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def rollout_dtype(name: str | None) -> torch.dtype | None:
    """`rollout.dtype` as torch's dtype; None ("auto") keeps each tensor in the dtype it was sent in."""
    return _DTYPES.get(str(name or "auto").lower())


class TappedUpdateMixin(Generic[Kept]):
    """Put in front of verl's `ServerAdapter` (vLLM's or sglang's): its `update_weights` with the check around it.

    A subclass says what it keeps of each sent tensor (`keep_sent`), whether this rank reads the rollout back
    (`reads_rollout`) and how it compares (`check_rollout`, raising StepCheckError naming the step). Their names
    are not verl's, so nothing of verl's adapter is shadowed."""

    # verl's ServerAdapter provides this (an annotation only: a method here would shadow verl's)
    config: Any

    def keep_sent(
        self, sent: dict[str, Kept], name: str, tensor: torch.Tensor, dtype: torch.dtype | None
    ) -> None:
        """Record into `sent` what the check needs of one tensor, cast to the rollout's `dtype`."""
        raise NotImplementedError

    def reads_rollout(self) -> bool:
        """Whether this rank reads the rollout back (asked after verl's update, which may start its client)."""
        raise NotImplementedError

    async def check_rollout(self, sent: dict[str, Kept], global_steps: int | None) -> str:
        """Compare what the rollout holds with `sent`: StepCheckError naming the step on a mismatch, else the
        digest of what matched (for the SYNC_MATCH_LINE)."""
        raise NotImplementedError

    async def update_weights(
        self,
        weights: Any,
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> Any:
        if wire_format != "named_tensors" or kwargs.get("peft_config") is not None:
            # LoRA adapters and delta flushes are not checked (the same on every rank)
            return await super().update_weights(  # type: ignore[misc]
                weights, global_steps=global_steps, wire_format=wire_format, **kwargs
            )
        dtype = rollout_dtype(getattr(self.config, "dtype", None))
        sent: dict[str, Kept] = {}

        def record(name: str, tensor: torch.Tensor) -> None:
            self.keep_sent(sent, name, tensor, dtype)

        result = await super().update_weights(  # type: ignore[misc]
            tap_stream(weights, record), global_steps=global_steps, wire_format=wire_format, **kwargs
        )
        problem, matched = None, None
        if self.reads_rollout():
            try:
                matched = await self.check_rollout(sent, global_steps)
            except StepCheckError as exc:
                problem = exc
        # every rank, checking or not: a failure on one stops all of them within seconds
        await asyncio.to_thread(agree_across_ranks, problem, global_steps)
        if matched is not None:
            # Ray forwards a worker's stdout to the run's log (a logger here has no handler in verl's workers)
            print(sync_match_line(global_steps, len(sent), matched), flush=True)  # noqa: T201
        return result


__all__ = ["TappedUpdateMixin", "rollout_dtype"]
