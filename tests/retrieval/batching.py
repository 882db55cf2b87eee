"""A real batch function for batcher tests: hashed bag-of-words vectors + a FAISS Flat index (inner product).

It searches the 20-passage fixture corpus for real (no canned answers), costs microseconds, records every
call so tests can see how queries were batched, and can be slowed down or gated to build up a queue.
"""

from __future__ import annotations

import json
import re
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.serving.batcher import Batcher

DIM = 256
_WORD = re.compile(r"\w+")


def embed(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in _WORD.findall(t.lower()):
            out[i, zlib.crc32(w.encode()) % DIM] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-9)


class HashedFlatSearch:
    """`fn(queries, topk)` for `Batcher`: exact inner-product search with FAISS over a JSONL corpus."""

    def __init__(self, corpus: Path, *, delay_s: float = 0.0) -> None:
        import faiss

        rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.docs = [Document(id=str(r["id"]), contents=r["contents"]) for r in rows]
        self.index = faiss.IndexFlatIP(DIM)
        self.index.add(embed([d.contents for d in self.docs]))
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[tuple[list[str], int]] = []
        self.threads: set[str] = set()

    def __call__(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        self.gate.wait(timeout=30)
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls.append((list(queries), topk))
        self.threads.add(threading.current_thread().name)
        scores, rows = self.index.search(embed(queries), topk)
        return [
            [
                ScoredDocument(document=self.docs[r], score=float(s))
                for r, s in zip(rr, ss, strict=True)
                if r >= 0
            ]
            for rr, ss in zip(rows.tolist(), scores.tolist(), strict=True)
        ]


class BatchedBackend(Backend):
    """A Backend that answers through a `Batcher`, the way the dense backend does."""

    name = "batched-test"

    def __init__(self, fn: HashedFlatSearch, **batcher_kw: Any) -> None:
        self.fn = fn
        self.batcher = Batcher(fn, name="test", **batcher_kw)
        self.closed = False

    def attach_metrics(self, metrics: Any) -> None:
        self.batcher.attach_metrics(metrics)

    async def start(self) -> None:
        await self.batcher.start()

    def problem(self) -> str | None:
        return self.batcher.problem()

    def busy(self) -> str | None:
        return self.batcher.busy()

    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        return await self.batcher.search(queries, topk)

    async def close(self) -> None:
        await self.batcher.close()
        self.closed = True
