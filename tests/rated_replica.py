"""A stand-in wiki-18 replica: the real service (create_app, its Batcher with the service's own limits) in front
of a search that costs what a replica's documented rate says, and a `GET /` that describes it as the dense
backend on wiki-18 does.

What it stands in for is the index and the encoder, which cannot be loaded here (64.5 GB Flat, 16.4 GB IVF-SQ8,
e5-base-v2): `RatedSearch` answers every batch after len(batch) / rate seconds, so the replica serves `rate`
queries/s however requests are batched (docs/sizing.md gives per-query costs, no batching gain), and returns real
hits from the 20-passage fixture corpus. Everything between the HTTP request and that call is the service's code:
routing, auth, the cross-request Batcher with its queue bound and request deadline (503 + Retry-After past it).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from searchrl.corpus_gate import WIKI18_PASSAGES
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.serving.batcher import Batcher
from searchrl.retrieval.settings import RetrievalSettings
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch


class RatedSearch:
    """`fn(queries, topk)` for the Batcher: real hits, after len(queries) / rate seconds (one worker thread)."""

    def __init__(self, corpus: Path, rate_qps: float) -> None:
        self.search = HashedFlatSearch(corpus)
        self.rate_qps = rate_qps
        self.served = 0
        self._lock = threading.Lock()

    def __call__(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        time.sleep(len(queries) / self.rate_qps)
        with self._lock:
            self.served += len(queries)
        return self.search(queries, topk)


class Wiki18Replica(BatchedBackend):
    """The dense backend's shape on wiki-18: `info()` as retrieval/backends/dense.py reports it, searches through
    the service's Batcher built from `settings` (Batcher.from_settings, as the dense backend builds it)."""

    name = "dense"

    def __init__(self, fn: RatedSearch, settings: RetrievalSettings, *, index_type: str) -> None:
        self.fn = fn
        self.index_type = index_type
        self.batcher = Batcher.from_settings(fn, settings, name="wiki18-standin")
        self.closed = False

    def info(self) -> dict[str, Any]:
        return {
            "backend": "dense",
            "corpus": "wiki18",
            "corpus_size": WIKI18_PASSAGES,
            "index_type": self.index_type,
            "encoder": "intfloat/e5-base-v2",
            "dim": 768,
            "device": "cpu",
            "index_dir": f"/data/indexes/wiki18/{self.index_type}",
            "corpus_checksum": "sha256:standin",
            "index_fingerprint": f"standin-{self.index_type}",
        }
