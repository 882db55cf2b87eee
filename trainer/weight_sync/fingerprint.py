"""An exact fingerprint of model weights, so the trainer can check that the rollout holds what it sent (issue 39).

verl's rollout/actor probability difference (`training/rollout_probs_diff_*`) is a statistical check: on GPUs bf16
noise alone is a few 1e-3 and a rollout a few steps stale at lr 1e-6 moves it far less, so a stale sync (TRL #5312,
slime PR 2380) is invisible there. This fingerprint is exact instead: after every weight update the rollout side
fingerprints the weights it now holds, the trainer fingerprints the tensors it sent, and any difference stops the
run with one line (`check_sync`). Both sides call this module: trainer/cpu/hf_rollout.py (the CPU engine),
trainer/weight_sync/vllm_sync.py (vLLM's worker extension and adapter) and trainer/weight_sync/sglang_sync.py (sampled rows read back).

A tensor's print is `(dtype, numel, s1, s2)`: the sum and the sum of squares of its elements' *bit patterns* read
as signed integers (bf16/fp16 as int16, fp32 as int32), summed in int64 (mod 2**64). Integer sums are exact and
do not depend on order, device or how the tensor is split, so:

- the trainer's tensor cast to the rollout's dtype (round to nearest even, the cast `load_state_dict` and vLLM's
  weight loaders do) prints bit for bit like the rollout's copy of it;
- a fused parameter (vLLM's `qkv_proj` = q, k, v stacked) prints as the sum of its parts' prints, and a
  tensor-parallel shard set as the sum of its shards' prints; zero padding (vLLM's padded vocabulary rows) adds 0;
- any single changed element changes s1 (its bit pattern changes by a non-zero integer).

What it does not see: elements permuted within one tensor (a transposed load) keep both sums; the bugs this
guards against (ignored or partial updates, the wrong source's weights) change values, not their order.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from searchrl.errors import StepCheckError

# Elements per int64 chunk: bounds the transient copy at 128 MiB however large the tensor (a 7B embedding is 545M).
CHUNK = 1 << 24
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class TensorPrint(NamedTuple):
    """One tensor's fingerprint; prints of disjoint pieces add up to the print of their concatenation."""

    dtype: str
    numel: int
    s1: int
    s2: int

    def __add__(self, other: object) -> TensorPrint:
        if not isinstance(other, TensorPrint):
            return NotImplemented
        return TensorPrint(
            self.dtype, self.numel + other.numel, _wrap(self.s1 + other.s1), _wrap(self.s2 + other.s2)
        )

    def times(self, copies: int) -> TensorPrint:
        """The print of `copies` copies of the tensor (a tensor-parallel layout that repeats it on several ranks)."""
        return TensorPrint(self.dtype, self.numel * copies, _wrap(self.s1 * copies), _wrap(self.s2 * copies))

    def same_values(self, other: TensorPrint) -> bool:
        """Equal dtype and sums (not numel: vLLM pads the vocabulary with zero rows, which add nothing)."""
        return (self.dtype, self.s1, self.s2) == (other.dtype, other.s1, other.s2)


def _wrap(value: int) -> int:
    """Python ints do not overflow; fold a sum of int64 sums back to int64 (mod 2**64) as torch's sums do."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_print(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> TensorPrint:
    """The print of `tensor` as the rollout holds it: cast to `dtype` first when given (None: as it is)."""
    t = tensor.detach()
    if hasattr(t, "full_tensor"):  # gathering it is a collective one rank must not start alone
        raise TypeError("a DTensor shard: print the full tensor the rollout receives (DTensor.full_tensor())")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.int8)
    bits = flat.view(_INT_VIEW[flat.element_size()]) if flat.is_floating_point() else flat
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    for chunk in torch.split(bits, CHUNK):
        wide = chunk.to(torch.int64)
        s1 += wide.sum()
        s2 += (wide * wide).sum()
    return TensorPrint(dtype_name(t.dtype), flat.numel(), int(s1.item()), int(s2.item()))


DtypeFor = Callable[[str], "torch.dtype | None"]


def fingerprint(
    named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | DtypeFor | None = None
) -> dict[str, TensorPrint]:
    """Prints of a named-tensor stream, keyed by name (so the stream's order does not matter).

    `dtype`: one dtype for every tensor, a function from name to dtype (the rollout's own dtypes), or None.
    A name sent twice is refused: the second copy would overwrite the first on the rollout too.
    """
    prints: dict[str, TensorPrint] = {}
    for name, tensor in named:
        if name in prints:
            raise ValueError(f"weight {name!r} appears twice in one update")
        target = dtype(name) if callable(dtype) else dtype
        prints[name] = tensor_print(tensor, target)
    return prints


def tap_stream(weights: Any, record: Callable[[str, torch.Tensor], None]) -> Any:
    """`weights` (verl's named-tensor stream, sync or async) unchanged, calling `record(name, tensor)` on each
    as the rollout's sender consumes it: the trainer-side record of a sync costs no second pass over the model."""
    seen: set[str] = set()

    def check(name: str, tensor: torch.Tensor) -> None:
        if name in seen:
            raise ValueError(f"weight {name!r} appears twice in one update")
        seen.add(name)
        record(name, tensor)

    if hasattr(weights, "__aiter__"):

        async def agen() -> AsyncIterator[tuple[str, torch.Tensor]]:
            async for name, tensor in weights:
                check(name, tensor)
                yield name, tensor

        return agen()

    def gen() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            check(name, tensor)
            yield name, tensor

    return gen()


def digest(prints: Mapping[str, TensorPrint]) -> str:
    """A short hex digest of a whole model's prints (names sorted), for the one-line failure message."""
    h = hashlib.sha256()
    for name in sorted(prints):
        h.update(f"{name}={tuple(prints[name])};".encode())
    return h.hexdigest()[:12]


def group_sent(
    sent: Mapping[str, TensorPrint], rollout_name: Callable[[str], str | None]
) -> dict[str, TensorPrint]:
    """The trainer's prints regrouped under the rollout's parameter names (parts of a fused parameter summed).

    `rollout_name(name)` gives the rollout parameter a sent tensor loads into, or None for one the rollout
    legitimately does not hold (a tied `lm_head.weight`). An unknown name keeps its own name, so it shows up as a
    difference rather than vanishing.
    """
    grouped: dict[str, TensorPrint] = {}
    for name in sorted(sent):
        target = rollout_name(name)
        if target is None:
            continue
        grouped[target] = grouped[target] + sent[name] if target in grouped else sent[name]
    return grouped


def merge_ranks(
    sent: Mapping[str, TensorPrint], ranks: Sequence[Mapping[str, TensorPrint]]
) -> dict[str, TensorPrint]:
    """One print per rollout parameter from its tensor-parallel ranks' prints.

    A parameter is either split across the ranks (its print is the sum of theirs) or replicated (every rank holds
    all of it: the print is any one rank's). Each parameter is read the way that matches what the trainer sent,
    so a correct sync compares equal either way; when neither matches, the sum is reported.
    """
    merged: dict[str, TensorPrint] = {}
    for name in sorted({n for rank in ranks for n in rank}):
        held = [rank[name] for rank in ranks if name in rank]
        total = held[0]
        for piece in held[1:]:
            total = total + piece
        expected = sent.get(name)
        replicated = len(held) == len(ranks) and all(p == held[0] for p in held)
        if (
            expected is not None
            and replicated
            and held[0].same_values(expected)
            and not total.same_values(expected)
        ):
            merged[name] = held[0]
        else:
            merged[name] = total
    return merged


def differences(held: Mapping[str, TensorPrint], sent: Mapping[str, TensorPrint]) -> list[str]:
    """Names whose prints differ, that only one side has, sorted."""
    return sorted(
        name
        for name in set(held) | set(sent)
        if name not in held or name not in sent or not held[name].same_values(sent[name])
    )


def check_sync(
    held: Mapping[str, TensorPrint], sent: Mapping[str, TensorPrint], global_steps: int | None
) -> None:
    """Raise StepCheckError with one line naming the step when the rollout does not hold what the trainer sent.

    `global_steps` is what verl passes with the update: the step just trained (0 for the sync before step 1), so
    the weights are the ones step `global_steps + 1` samples from.
    """
    diff = differences(held, sent)
    if not diff:
        return
    step = int(global_steps or 0) + 1
    when = "the initial sync" if step == 1 else f"the update after step {step - 1}"
    first = diff[0]
    detail = (
        " (missing on the rollout)"
        if first not in held
        else " (not sent by the trainer)"
        if first not in sent
        else ""
    )
    raise StepCheckError(
        f"weight sync check failed at step {step} ({when}): rollout holds {digest(held)} but the trainer sent "
        f"{digest(sent)} ({len(diff)} of {len(set(held) | set(sent))} tensors differ, first: {first}{detail})"
    )


# How long a rank waits for the others to report their check (agree_across_ranks): past it a rank that never came
# is taken as failed. Far above the spread of a healthy sync's end across ranks (each waits for its own load).
AGREE_TIMEOUT_S = 120.0


def agree_across_ranks(problem: StepCheckError | None, global_steps: int | None) -> None:
    """Every trainer rank learns whether any rank's sync check failed, and then all raise together.

    Only a rank that holds a rollout server runs the check (the others only send). Were it to raise alone, the
    others would walk on into verl's next collective and wait there for torch's timeout (verl 0.9.1 passes
    `timeout=None` to its process groups, utils/distributed.py:88: 10 minutes on NCCL, on every GPU of the run).
    So each rank contributes one flag to a MAX all-reduce on the default group's gloo backend (verl starts it as
    `cpu:gloo,<device>:nccl`; a CPU tensor takes gloo) and waits at most AGREE_TIMEOUT_S: a rank that never
    reaches the agreement (it raised earlier) stops the others in that time too.
    """
    import datetime

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if problem is not None:
            raise problem
        return
    step = int(global_steps or 0) + 1
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int32)
    try:
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        assert work is not None
        work.wait(timeout=datetime.timedelta(seconds=AGREE_TIMEOUT_S))
    except RuntimeError as exc:
        raise StepCheckError(
            f"weight sync check at step {step}: not every trainer rank reported its check within "
            f"{AGREE_TIMEOUT_S:.0f} s ({str(exc).splitlines()[0][:120]}); another rank failed before it (see its "
            "error above), so this rank stops too"
        ) from problem
    if problem is not None:
        raise problem
    if int(flag.item()):
        raise StepCheckError(
            f"weight sync check failed at step {step} on another trainer rank (its error names the tensors); "
            "this rank stops with it"
        )


__all__ = [
    "AGREE_TIMEOUT_S",
    "TensorPrint",
    "agree_across_ranks",
    "check_sync",
    "differences",
    "digest",
    "dtype_name",
    "fingerprint",
    "group_sent",
    "merge_ranks",
    "tap_stream",
    "tensor_print",
]
