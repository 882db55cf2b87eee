"""In-process measures of the dense backend for `searchrl bench` (searchrl/bench/service.py): (a) the batch
function's ceiling over a grid, (a') encoder workers 1..N, and an E5-base-shaped encoder's rate."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from searchrl.bench.loadgen import TOPK
from searchrl.bench.service_load import QueryPool
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


def measure_ceiling(
    settings: RetrievalSettings,
    pool: QueryPool,
    *,
    precisions: tuple[str, ...] = ("fp32",),
    batch_sizes: tuple[int, ...] = (32, 64, 128),
    forward_sizes: tuple[int, ...] = (16, 32),
    threads: tuple[int, ...] = (1, 2),
    seconds: float = 3.0,
) -> list[dict[str, Any]]:
    """queries/s of the dense backend's batch function called directly, over a grid of configurations:
    precision x model threads x forward-pass size x batch size (queries per call).

    A precision whose first point runs at under half the best rate so far is measured at that point only
    (bf16 without AVX-512 BF16 is ~5x slower than fp32 here; its grid would take minutes).
    """
    # before torch/faiss load OpenMP: see retrieval/encoders/encoder.py (spinning threads starve everything else)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import faiss
    import torch

    from searchrl.retrieval.backends.dense import DenseBackend

    rows: list[dict[str, Any]] = []
    best = 0.0
    for precision in precisions:
        # today's path: the torch encoder, exactly as configured, no auto-tuning and one worker
        fixed = {"precision": precision, "encoder_backend": "torch", "autotune": False, "encoder_workers": 1}
        backend = DenseBackend(settings.with_changes(**fixed))
        asyncio.run(backend.start())
        encoder = backend._encoder
        assert encoder is not None
        try:
            first = True
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                faiss.omp_set_num_threads(n_threads)
                backend._search_sync(pool.take(8), TOPK)  # warm-up: first call allocates
                for fwd in forward_sizes:
                    encoder.batch_size = fwd
                    for bs in batch_sizes:
                        if bs < fwd:
                            continue
                        done = 0
                        started = time.perf_counter()
                        while True:
                            backend._search_sync(pool.take(bs), TOPK)
                            done += bs
                            elapsed = time.perf_counter() - started
                            if elapsed >= seconds:
                                break
                        qps = done / elapsed
                        rows.append(
                            {
                                "precision": precision,
                                "threads": n_threads,
                                "forward": fwd,
                                "batch_size": bs,
                                "qps": qps,
                                "queries": done,
                            }
                        )
                        log.info(
                            "ceiling %s, %d threads, forward %d, batch %d: %.0f queries/s",
                            precision,
                            n_threads,
                            fwd,
                            bs,
                            qps,
                        )
                        best = max(best, qps)
                        if first and qps < 0.5 * best:
                            break
                        first = False
                    else:
                        continue
                    break
                else:
                    continue
                log.info("ceiling: %s is too slow here; skipping the rest of its grid", precision)
                break
        finally:
            asyncio.run(backend.close())
    return rows


def measure_e5_shape(
    queries: list[str], *, seconds: float = 2.0, batch_size: int = 128, forward: int = 32
) -> list[dict[str, Any]]:
    """Encoder-only queries/s of a BERT-base-shaped model (E5-base: 12 layers, 768 wide), per candidate.

    E5 weights cannot be downloaded here, so the model is randomly initialised with e5-base-v2's shape: the
    compute per query is the same, the vectors are meaningless (recall is measured on MiniLM, not here).
    """
    import tempfile

    from transformers import AutoTokenizer, BertConfig, BertModel

    from searchrl.retrieval.encoders.encoder import Encoder, bundled_minilm_path
    from searchrl.retrieval.encoders.pool import available_cores
    from searchrl.retrieval.encoders.tuning import _build, cpu_info, has_fast_bf16

    cores = len(available_cores())
    names = ["torch-fp32", "onnx-fp32"]
    if has_fast_bf16(cpu_info()["flags"]):
        names.insert(1, "torch-bf16")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="e5-shape-") as tmp:
        folder = Path(tmp) / "e5-base-shape"
        tokenizer = AutoTokenizer.from_pretrained(str(bundled_minilm_path()))  # the same uncased BERT vocab
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(folder)  # BERT-base defaults
        tokenizer.save_pretrained(folder)
        base = Encoder.load(str(folder), device="cpu", precision="fp32", batch_size=forward)
        for name in names:
            encoder = _build(name, base, Path(tmp), "e5-shape", cores, forward)
            encoder.encode_queries(queries[:batch_size])  # warm-up
            done, pos, started = 0, batch_size, time.perf_counter()
            while time.perf_counter() - started < seconds:
                encoder.encode_queries(queries[pos : pos + batch_size])
                pos, done = pos + batch_size, done + batch_size
            qps = done / (time.perf_counter() - started)
            rows.append({"candidate": name, "threads": cores, "qps": round(qps, 1)})
            log.info("E5-base shape %s, %d threads: %.0f queries/s (encoder only)", name, cores, qps)
    return rows


def measure_workers(
    settings: RetrievalSettings,
    pool: QueryPool,
    choice: dict[str, Any],
    *,
    seconds: float = 3.0,
    batch_size: int = 128,
) -> list[dict[str, Any]]:
    """In-process queries/s of the chosen encoder with 1..N workers of one thread each (N = usable cores).

    The dense backend's own batch function, as in (a), so the curve shows what workers add on this machine.
    """
    from searchrl.retrieval.backends.dense import DenseBackend

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    backend_name, precision = str(choice["candidate"]).split("-")
    rows: list[dict[str, Any]] = []
    for workers in range(1, cores + 1):
        fixed = {
            "autotune": False,
            "encoder_backend": backend_name,
            "precision": precision,
            "encoder_workers": workers,
            "threads": workers,  # one per worker
            "forward_batch_size": int(choice["forward_batch_size"]),
        }
        backend = DenseBackend(settings.with_changes(**fixed))
        asyncio.run(backend.start())
        try:
            # the batch function has no cache, so cycling through queries the scenarios used is fair
            backend._search_sync(pool.queries[:batch_size], TOPK)  # warm-up
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                start = done % max(1, len(pool.queries) - batch_size)
                backend._search_sync(pool.queries[start : start + batch_size], TOPK)
                done += batch_size
            qps = done / (time.perf_counter() - started)
        finally:
            asyncio.run(backend.close())
        rows.append(
            {"candidate": choice["candidate"], "workers": workers, "threads": 1, "qps": round(qps, 1)}
        )
        log.info("workers scaling %s: %d x 1 thread: %.0f queries/s", choice["candidate"], workers, qps)
    return rows


__all__ = ["measure_ceiling", "measure_e5_shape", "measure_workers"]
