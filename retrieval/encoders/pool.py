"""Several query-encoder workers behind the one batcher: all cores of a big replica, one FAISS owner.

Why: one BERT forward pass on small query batches does not scale past a few threads (its matmuls are too small
to split 16 ways), so a 16-core replica served by one model instance leaves most cores idle. Here each worker
owns a copy of the encoder (its own ONNX Runtime session and thread pool, or torch threads) pinned to its own
cores, and one batch from the batcher is split across the workers; the dense worker thread then searches FAISS
with all the vectors. So the batcher, its queue and the FAISS index keep exactly one owner, as before.

Threads, not processes: ORT `session.run` and torch forward passes release the GIL, so N worker threads run
N forward passes at once without copying the model N times into N processes or pickling vectors back. Each
worker gets its own tokenizer copy: HF fast tokenizers raise "Already borrowed" when shared across threads.
Pinning uses `os.sched_setaffinity(0, ...)`, which on Linux applies to the calling thread, and the threads ORT
starts for that worker's session inherit it (the session is created after pinning, on the worker thread).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from searchrl.retrieval.encoders.encoder import Encoder

log = logging.getLogger(__name__)

#: Builds worker i's encoder; called on that worker's own (already pinned) thread.
EncoderFactory = Callable[[int], Encoder]


def available_cores() -> list[int]:
    """The CPUs this process may run on (a container's cgroup/affinity limit, not the host's count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def core_sets(workers: int, threads: int, cores: list[int] | None = None) -> list[list[int]]:
    """Disjoint core sets of `threads` cores per worker (wrapping round when workers x threads > cores)."""
    cores = cores or available_cores()
    return [[cores[(w * threads + t) % len(cores)] for t in range(threads)] for w in range(workers)]


def own_tokenizer(encoder: Encoder) -> Encoder:
    """A shallow copy of `encoder` with its own tokenizer, safe to run beside the original on another thread."""
    clone = copy.copy(encoder)
    clone.tokenizer = copy.deepcopy(encoder.tokenizer)
    return clone


class EncoderPool:
    """`workers` encoders behind the `Encoder` query interface; a batch is dealt out across them.

    With one worker it calls that encoder directly on the caller's thread (no hand-off, today's behaviour).
    """

    def __init__(
        self, factory: EncoderFactory, *, workers: int, threads: int, pin: bool = True, name: str = "encoder"
    ) -> None:
        if workers < 1 or threads < 1:
            raise ValueError("workers and threads must be at least 1")
        self.workers = workers
        self.threads = threads
        self.pinned = pin and workers > 1 and hasattr(os, "sched_setaffinity")
        self._executors: list[ThreadPoolExecutor] = []
        self.encoders: list[Encoder] = []
        if workers == 1:
            self.encoders.append(factory(0))
        else:
            sets = core_sets(workers, threads)
            for i in range(workers):
                executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-{i}")
                self._executors.append(executor)
                self.encoders.append(executor.submit(self._start_worker, factory, i, sets[i]).result())
            log.info(
                "%s pool: %d workers x %d threads%s",
                name,
                workers,
                threads,
                f", pinned to {sets}" if self.pinned else "",
            )
        # the Encoder interface the dense backend reads: every worker loaded the same encoder, on one device
        first = self.encoders[0]
        self.spec, self.dim, self.device = first.spec, first.dim, first.device

    def _start_worker(self, factory: EncoderFactory, index: int, cores: list[int]) -> Encoder:
        if self.pinned:
            os.sched_setaffinity(0, cores)  # this thread only (Linux), inherited by threads it starts
        return factory(index)

    # --- the Encoder interface the dense backend uses ----------------------------------------------------------
    @property
    def first(self) -> Encoder:
        return self.encoders[0]

    @property
    def batch_size(self) -> int:
        return self.first.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        for encoder in self.encoders:
            encoder.batch_size = value

    def encode_queries(self, queries: list[str], *, batch_size: int | None = None) -> np.ndarray:
        if self.workers == 1 or len(queries) < 2:
            return self.first.encode_queries(queries, batch_size=batch_size)
        # Deal queries out longest-first, round-robin, so every worker gets the same mix of lengths and they
        # finish together; each worker length-sorts its share again into forward passes.
        order = np.argsort([-len(q) for q in queries], kind="stable")
        shares = [order[i :: self.workers] for i in range(self.workers)]
        futures = [
            executor.submit(encoder.encode_queries, [queries[j] for j in share], batch_size=batch_size)
            for executor, encoder, share in zip(self._executors, self.encoders, shares, strict=True)
            if len(share)
        ]
        out = np.empty((len(queries), self.dim), dtype=np.float32)
        for share, future in zip([s for s in shares if len(s)], futures, strict=True):
            out[share] = future.result()
        return out

    def describe(self) -> dict[str, Any]:
        return {**self.first.describe(), "encoder_workers": self.workers, "threads_per_worker": self.threads}

    def close(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True)
        self._executors.clear()


__all__ = ["EncoderPool", "available_cores", "core_sets", "own_tokenizer"]
