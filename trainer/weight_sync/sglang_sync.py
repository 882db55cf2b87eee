"""The weight-sync check on sglang (issue 39 item 1): the rollout server reads back what it holds, by name.

verl 0.9.1 syncs sglang weights in `ServerAdapter.update_weights` (workers/rollout/sglang_rollout/
sglang_rollout.py:305-390): every trainer rank streams named tensors; each tensor-parallel leader gathers its
group's CUDA-IPC handles and POSTs them to its sglang server's `/update_weights_from_tensor` (sglang's
`weight_sync.utils.update_weights`), then `/flush_cache`. Nothing reads back what the server holds.

sglang has no worker extension to run our own code in its tensor-parallel workers (vLLM's route,
trainer/weight_sync/vllm_sync.py). What it offers (read in sglang's source, sgl-project/sglang, the line verl's `sglang`
extra pins, 0.5.12) is `/get_weights_by_name` (POST `{"name", "truncate_size"}`): the tokenizer manager asks every
scheduler, each tensor-parallel worker runs the model class's `get_weights_by_name(name, truncate_size, tp_size)`,
and the reply is tensor-parallel rank 0's answer as a JSON list: the parameter cast to float32, `.tolist()`, cut to
its first `truncate_size` rows (elements, for a 1-D tensor); one such list per data-parallel rank when dp > 1.
The model class takes HF names (q/k/v and gate/up are sliced out of the fused parameter) and, in Llama's, gathers
the row-parallel `o_proj`/`down_proj` over the ranks; embeddings and column-parallel weights are rank 0's shard,
whose first rows are the full tensor's first rows.

So the check here is exact but sampled, the nearest honest one sglang allows: after verl's update, the leader asks
for the first ROWS rows of every tensor it sent, and compares them bit for bit (float32, no rounding) with the
same block of what it sent, cast to the rollout dtype (`rollout.dtype`) as sglang's loader casts it. A reply that
is narrower than the sent row (a row-parallel shard the model class did not gather) is compared with the same
columns. A stale or partial load (every element changes after a training step) shows in the sampled rows; a
change confined to rows past ROWS does not. A name the model class cannot read (sglang logs the error and answers
400) or an empty reply stops the run too: a check that did not run is a failure.

Registered for `rollout.name=sglang` as vllm_sync is for vLLM (trainer/overrides.py, `VERL_USE_EXTERNAL_MODULES`);
the class that needs sglang lives in trainer/weight_sync/sglang_classes.py. Importing this module needs no sglang.

Cost (ESTIMATE, not measured: no GPU here): one request per tensor per sync, ROWS rows as JSON; a 3B Qwen2 has
~430 tensors, ~4 x 2048-11008 floats each: ~60 MB of JSON and ~430 round trips through sglang's scheduler a sync.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import torch

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync.fingerprint import TensorPrint, check_sync, digest, tensor_print
from searchrl.trainer.weight_sync.tap import TappedUpdateMixin

log = logging.getLogger(__name__)

ROLLOUT_NAME = "sglang"
CLASSES = "searchrl.trainer.weight_sync.sglang_classes"
ENDPOINT = "get_weights_by_name"
# Rows (elements of a 1-D tensor) read back per tensor: sglang's `truncate_size`.
ROWS = 4
READ_TIMEOUT_S = 120.0


def leading_block(tensor: torch.Tensor, dtype: torch.dtype | None, rows: int = ROWS) -> torch.Tensor:
    """The first `rows` rows of `tensor` as the rollout holds them (cast to `dtype`), as float32 (exact)."""
    t = tensor.detach()
    if hasattr(t, "full_tensor"):
        raise TypeError("a DTensor shard: record the full tensor the rollout receives")
    block = t.reshape(1) if t.dim() == 0 else t[:rows]
    if dtype is not None and block.dtype != dtype:
        block = block.to(dtype)
    return block.to(torch.float32).clone()


def _depth(value: Any) -> int:
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth


def read_copies(reply: Any, ndim: int) -> list[torch.Tensor]:
    """sglang's reply as float32 tensors, one per data-parallel rank ([] for an empty or unreadable reply)."""
    ndim = max(ndim, 1)
    if not isinstance(reply, list) or not reply:
        return []
    depth = _depth(reply)
    copies = [reply] if depth == ndim else reply if depth == ndim + 1 else []
    out = []
    for copy in copies:
        try:
            # JSON numbers are float32 values printed exactly; float64 holds them, float32 gets them back bit for bit
            out.append(torch.tensor(copy, dtype=torch.float64).to(torch.float32))
        except (TypeError, ValueError):
            return []
    return [t for t in out if t.numel()]


def compare_blocks(
    replies: Mapping[str, Any], sent: Mapping[str, torch.Tensor], global_steps: int | None
) -> str:
    """Raise StepCheckError naming the step when a read-back block differs from the block the trainer sent; else
    the digest of the blocks that matched (for the run's `step_checks.SYNC_MATCH_LINE`)."""
    step = int(global_steps or 0) + 1
    held: dict[str, TensorPrint] = {}
    expected: dict[str, TensorPrint] = {}
    for name, block in sent.items():
        copies = read_copies(replies.get(name), block.dim())
        if not copies:
            raise StepCheckError(
                f"weight sync check failed at step {step}: sglang's /{ENDPOINT} returned nothing for {name} "
                f"({str(replies.get(name))[:80]}); does the model class implement get_weights_by_name?"
            )
        for rank, got in enumerate(copies):
            key = name if len(copies) == 1 else f"{name}@dp{rank}"
            if got.dim() == block.dim() and all(g <= b for g, b in zip(got.shape, block.shape, strict=True)):
                # the same rows (and, for a row-parallel shard sglang did not gather, the same leading columns)
                want = block[tuple(slice(0, n) for n in got.shape)]
            else:
                want = block
            held[key], expected[key] = tensor_print(got), tensor_print(want)
    check_sync(held, expected, global_steps)
    return digest(expected)


async def read_back(engine: Any, names: list[str], rows: int = ROWS) -> dict[str, Any]:
    """Ask the server for the first `rows` rows of each tensor through verl's HTTP adapter (its retries and
    error handling); a refused name maps to None, so the comparison names it."""
    replies: dict[str, Any] = {}
    for name in names:
        try:
            replies[name] = await engine._make_async_request(
                ENDPOINT, {"name": name, "truncate_size": rows}, timeout=READ_TIMEOUT_S
            )
        except (aiohttp.ClientError, RuntimeError) as e:
            log.error("sglang could not read back %s: %s", name, e)
            replies[name] = None
    return replies


class SglangFingerprintMixin(TappedUpdateMixin[torch.Tensor]):
    """Added to verl's sglang `ServerAdapter`: after verl's update, the leader reads back and compares
    (trainer/weight_sync/tap.py wraps verl's `update_weights`)."""

    # verl's ServerAdapter provides these (annotations only: a method here would shadow verl's)
    _engine: Any
    _is_server_tp_leader: Any

    def keep_sent(
        self, sent: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, dtype: torch.dtype | None
    ) -> None:
        # the name sglang loads it under (verl strips LoRA's `.base_layer.`)
        sent[name.replace(".base_layer.", ".")] = leading_block(tensor, dtype)

    def reads_rollout(self) -> bool:
        # one rank per server reads: the tensor-parallel leader on the replica's first node (verl's HTTP adapter
        # answers {} on the others, whose server is the same replica)
        return bool(
            self._engine is not None
            and self._is_server_tp_leader()
            and not int(getattr(self._engine, "node_rank", 0))
        )

    async def check_rollout(self, sent: dict[str, torch.Tensor], global_steps: int | None) -> str:
        return compare_blocks(await read_back(self._engine, sorted(sent)), sent, global_steps)


# ---- registration ---------------------------------------------------------------------------------------------


def register() -> None:
    """Point verl's `sglang` rollout at the checking adapter (no sglang import here)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{CLASSES}.FingerprintServerAdapter"


register()

__all__ = [
    "CLASSES",
    "ENDPOINT",
    "ROWS",
    "SglangFingerprintMixin",
    "compare_blocks",
    "leading_block",
    "read_back",
    "read_copies",
    "register",
]
