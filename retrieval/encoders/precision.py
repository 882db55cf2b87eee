"""The precision an index build encodes passages in: bf16 only where the CPU has native BF16 and it measures faster.

Why: encoding is nearly all of a dense build on CPU (the bundled 10,033 passages with MiniLM: 235-460 s in fp32 on a
2-core Zen 4, quiet or shared, and about 950 s on an AVX2-only EPYC), and on a CPU with AVX-512 BF16 or AMX a bf16
forward pass runs at about twice fp32, while without them torch emulates bf16 several times slower. So `precision=auto` (the default)
on CPU follows the rule the serving encoder (retrieval/encoders/tuning.py) and CPU training (trainer/cpu/precision.py)
use: bf16 is never tried without the CPU flag, and with it the build encodes the corpus's first `SAMPLE` passages in
both precisions, interleaved, and keeps bf16 only when it is `MIN_SPEEDUP` times faster and every sampled vector stays
within `MIN_COSINE` of its fp32 twin. The choice and its measurement are logged, and the manifest's `encoder` records
the precision the passages were encoded in.

What bf16 costs and saves, measured on the bundled corpus by `make bench-build` (issue 47, quiet 2-core Zen 4): the
build in 130 s against 235 s in fp32 (1.81x), every passage vector within cosine 0.99993 of its fp32 twin, the same
recall@3 on the dev set, and the top 3 of 400 held-out queries 99.2% the same (the serving gate asks 99%). Queries
are still encoded by the serving encoder, whatever the build used.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Collection
from itertools import islice
from pathlib import Path

import numpy as np

from searchrl.retrieval.corpus import iter_rows_with_offsets
from searchrl.retrieval.encoders.encoder import Encoder

log = logging.getLogger(__name__)

SAMPLE = 96  # passages from the corpus head encoded in each precision
MIN_CORPUS = (
    10 * SAMPLE
)  # below this the measurement costs about what bf16 would save: fp32 without measuring
MIN_SPEEDUP = (
    1.2  # bf16 must beat fp32 by this much to be worth its rounding (trainer/cpu/precision.py's bar)
)
# 1 - cosine is half the squared distance between unit vectors, so 0.9995 bounds how far any score can move by
# sqrt(2 * 0.0005) = 0.032 (Cauchy-Schwarz); MiniLM in bf16 measured 0.99993 (a 0.012 bound) on all 10,033 passages
MIN_COSINE = 0.9995


def bf16_twin(encoder: Encoder) -> Encoder:
    """The same encoder with its weights cast to bf16 (a copy: `encoder` keeps serving in fp32)."""
    import torch

    twin = copy.copy(encoder)
    twin.model = copy.deepcopy(encoder.model).to(torch.bfloat16)
    twin.precision = "bf16"
    return twin


def timed_encode(encoder: Encoder, passages: list[str], batch_size: int) -> tuple[float, np.ndarray]:
    """(seconds, vectors) for encoding `passages` as a build does."""
    started = time.perf_counter()
    vectors = encoder.encode_passages(passages, batch_size=batch_size)
    return time.perf_counter() - started, vectors


def choose_build_encoder(
    reference: Encoder,
    corpus_path: Path,
    total: int,
    *,
    batch_size: int = 64,
    flags: Collection[str] | None = None,
) -> tuple[Encoder, str]:
    """The encoder a `precision=auto` build uses, given the fp32 (or GPU) one it loaded, and why (one line)."""
    from searchrl.retrieval.encoders.tuning import cpu_info, has_fast_bf16

    if reference.device != "cpu" or reference.precision != "fp32":
        return reference, f"{reference.precision}: the default on {reference.device}"
    if not has_fast_bf16(cpu_info()["flags"] if flags is None else set(flags)):
        return reference, "fp32: this CPU has no native BF16 (bf16 would be emulated)"
    if total < MIN_CORPUS:
        return reference, f"fp32: {total} passages are too few for measuring bf16 to pay off (< {MIN_CORPUS})"
    sample = [p.contents for _, _, p in islice(iter_rows_with_offsets(corpus_path), SAMPLE)]
    twin = bf16_twin(reference)
    seconds = {"fp32": 0.0, "bf16": 0.0}
    vectors: dict[str, list[np.ndarray]] = {"fp32": [], "bf16": []}
    for encoder in (reference, twin):  # first calls pick and compile kernels: not timed
        encoder.encode_passages(sample[:8], batch_size=batch_size)
    half = len(sample) // 2
    for part in (sample[:half], sample[half:]):  # interleaved, so a neighbour's load falls on both alike
        for name, encoder in (("fp32", reference), ("bf16", twin)):
            took, vecs = timed_encode(encoder, part, batch_size)
            seconds[name] += took
            vectors[name].append(vecs)
    cosine = float((np.concatenate(vectors["fp32"]) * np.concatenate(vectors["bf16"])).sum(axis=1).min())
    speedup = seconds["fp32"] / max(seconds["bf16"], 1e-9)
    measured = (
        f"the first {len(sample)} passages at {len(sample) / seconds['bf16']:.1f} passages/s in bf16, "
        f"{len(sample) / seconds['fp32']:.1f} in fp32 ({speedup:.2f}x), cosine to fp32 >= {cosine:.5f}"
    )
    if cosine < MIN_COSINE:
        return reference, f"fp32: bf16 moved a passage vector too far ({measured}; needs {MIN_COSINE})"
    if speedup < MIN_SPEEDUP:
        return reference, f"fp32: bf16 is not fast enough here ({measured}; needs {MIN_SPEEDUP}x)"
    return twin, f"bf16: {measured}"


__all__ = ["MIN_CORPUS", "MIN_COSINE", "MIN_SPEEDUP", "SAMPLE", "bf16_twin", "choose_build_encoder"]
