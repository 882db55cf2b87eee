"""BM25 backend: bm25s over the configured corpus; no torch, no faiss.

Queries are tokenised exactly as the index was (lowercase, English stopwords, Snowball English stemmer;
the manifest records this and `verify_manifest` checks it).

Requests go through the same `Batcher` as dense (issue 13): one bounded queue with 503 + Retry-After past
`queue_size`, a per-request deadline, the result cache and in-flight de-duplication. Before that, an
unbounded executor queue let latency grow past every client's timeout at ~1,000 concurrent clients.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from searchrl.retrieval.backends.batched import BatchedBackend
from searchrl.retrieval.corpus import DocStore
from searchrl.retrieval.index.build import (
    BM25_DIR,
    BM25_STEMMER,
    BM25_STOPWORDS,
    OFFSETS,
    ensure_index,
    verify_manifest,
)
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.serving.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)
_ratelog = RateLimitedLog(log)


class BM25Backend(BatchedBackend):
    """Lexical retrieval; all index work runs on one worker thread so the event loop never blocks."""

    name = "bm25"

    # One thread (BatchedBackend's): the stemmer and bm25s retriever are not documented as thread-safe, and one
    # BM25 query over 10k passages takes ~1 ms, so a single worker is not the bottleneck.
    def __init__(self, settings: RetrievalSettings) -> None:
        super().__init__(settings)
        self._retriever: Any = None
        self._stemmer: Any = None

    def _started(self) -> bool:
        return self._retriever is not None

    def _load(self) -> None:
        import bm25s
        import Stemmer

        index_dir = ensure_index(self.settings, "bm25")
        started = time.perf_counter()
        corpus_path, manifest = self._checked_manifest(index_dir)
        store = DocStore.open(corpus_path, index_dir / OFFSETS)
        retriever = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=True, show_progress=False)
        for count in (len(store), int(retriever.scores["num_docs"])):
            verify_manifest(manifest, index_dir, kind="bm25", count=count)
        self._stemmer = Stemmer.Stemmer(BM25_STEMMER)
        # bm25s sets its logger to DEBUG and logs one INFO line per stopword-only query (a log flood under RL)
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self._retriever, self._store, self.manifest, self.index_dir = retriever, store, manifest, index_dir
        self.open_seconds = time.perf_counter() - started
        log.info(
            "bm25 backend ready: %d passages from %s (opened in %.3fs)",
            len(store),
            index_dir,
            self.open_seconds,
        )

    def _search_batch(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        """Score a batch of queries; runs on the worker thread."""
        import bm25s

        assert self._store is not None
        k = min(topk, len(self._store))
        tokens = bm25s.tokenize(
            queries,
            stopwords=BM25_STOPWORDS,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )
        # A query with no indexed token (all stopwords, unknown words) scores 0 everywhere; bm25s maps it
        # to its empty token, so it still gets k (arbitrary, score 0) results rather than an error. bm25s
        # logs that at INFO once per query; we silence it (in _load) and write one aggregated line.
        empty = sum(1 for t in tokens if not t)
        if empty:
            _ratelog.info(
                "empty", "bm25: %d queries had only stopwords/no indexed word (score-0 results)", empty
            )
        rows, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        return self._store.hits(rows.tolist(), scores.tolist())

    def info(self) -> dict[str, Any]:
        return self._index_info(index_type="bm25s", encoder=None, dim=None)

    async def close(self) -> None:
        await super().close()
        self._retriever = None


__all__ = ["BM25Backend"]
