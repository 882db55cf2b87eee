"""The precision a CPU training run uses: bf16 only where the CPU has native BF16 and it measures faster.

On a CPU with AVX-512 BF16 (Zen 4/5) or AMX (Sapphire Rapids and later) bf16 matmuls run at about twice fp32
(issue 32 measured a SmolLM2 training step at 27 s in bf16 against 56 s in fp32 on a Zen 5); without them torch
emulates bf16 and runs several times slower than fp32. The rule is the retrieval encoder's (retrieval/
encoders/tuning.py): bf16 is never tried without the CPU flag, and with it a short timed forward and backward in
each precision decides. `choose_cpu_dtype` returns the torch dtype name and the reason, which the run prints.

A bf16 run computes the actor, the reference and the rollout in bf16 (fp32 master weights and reductions), so
their token probabilities differ by bf16 rounding: the per-step sync check then uses verl's mean-difference bound
(step_checks.PROB_DIFF_MEAN_FAIL) rather than the fp32 run's 1e-4 maximum. The learning run stays fp32 everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from searchrl.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
MIN_SPEEDUP = 1.2  # bf16 must beat fp32 by this much to be worth its rounding


def time_train_step(model_dir: Path, dtype: str, *, tokens: int = 256, repeats: int = 2) -> float:
    """Seconds for one forward and backward of `tokens` tokens in `dtype` (the best of `repeats`)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up kernels and allocations
        started = time.perf_counter()
        model(ids, labels=ids).loss.backward()
        best = min(best, time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return best


def choose_cpu_dtype(
    model_dir: Path,
    requested: str = "auto",
    *,
    flags: set[str] | None = None,
    timer: Callable[[Path, str], float] = time_train_step,
) -> tuple[str, str]:
    """(torch dtype name, why) for `requested` in PRECISIONS on this CPU."""
    from searchrl.retrieval.encoders.tuning import cpu_info, has_fast_bf16

    if requested not in PRECISIONS:
        raise ConfigError(f"--precision {requested!r}: use one of {', '.join(PRECISIONS)}")
    fast = has_fast_bf16(cpu_info()["flags"] if flags is None else flags)
    if requested == "fp32":
        return DTYPES["fp32"], "fp32 as asked"
    if requested == "bf16":
        if not fast:
            raise ConfigError(
                "--precision bf16 on a CPU without native BF16 (avx512_bf16/amx_bf16): torch would emulate it, "
                "several times slower than fp32; use --precision auto or fp32"
            )
        return DTYPES["bf16"], "bf16 as asked"
    if not fast:
        return DTYPES["fp32"], "fp32: this CPU has no native BF16 (bf16 would be emulated)"
    fp32_s, bf16_s = timer(model_dir, "float32"), timer(model_dir, "bfloat16")
    speedup = fp32_s / bf16_s
    if speedup >= MIN_SPEEDUP:
        return DTYPES["bf16"], f"bf16: a training step measured {speedup:.2f}x faster than fp32"
    return DTYPES["fp32"], f"fp32: bf16 measured only {speedup:.2f}x fp32 (needs {MIN_SPEEDUP}x)"


__all__ = ["DTYPES", "MIN_SPEEDUP", "PRECISIONS", "choose_cpu_dtype", "time_train_step"]
