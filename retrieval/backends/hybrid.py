"""Hybrid backend: dense (FAISS) and BM25 rankings fused with weighted reciprocal rank fusion.

    SEARCHRL_RETRIEVAL_BACKEND=hybrid searchrl serve

Dense retrieval finds paraphrases; BM25 finds rare names, numbers and exact titles that a small encoder
blurs. RRF (Cormack, Clarke & Buettcher, SIGIR 2009, https://doi.org/10.1145/1571941.1572114) fuses ranks
rather than scores, so the two scales (cosine vs BM25) never need calibrating:

    score(d) = sum_i  w_i / (k + rank_i(d))         rank from 1; a list that misses d adds nothing

Each inner backend returns `hybrid_depth` candidates (at least top-k); ties are broken by the better single
rank, then by document id, so results are deterministic. Measured recall@3 on searchrl/data/dev_qa.jsonl:
`searchrl index recall` (docs/web-search.md has the table).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from searchrl.errors import BackendError, ConfigError
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings


def rrf_fuse(
    rankings: Sequence[Sequence[ScoredDocument]], weights: Sequence[float], *, k: float, topk: int
) -> list[ScoredDocument]:
    """Fuse best-first rankings of one query into one list of `topk`, scored by weighted RRF."""
    if len(rankings) != len(weights):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    scores: dict[str, float] = {}
    best_rank: dict[str, int] = {}
    docs: dict[str, ScoredDocument] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        if weight <= 0:
            continue
        seen: set[str] = set()
        for rank, hit in enumerate(ranking, start=1):
            doc_id = hit.document.id
            if doc_id in seen:  # a list that repeats a document counts it once, at its best rank
                continue
            seen.add(doc_id)
            scores[doc_id] = scores.get(doc_id, 0.0) + weight / (k + rank)
            best_rank[doc_id] = min(best_rank.get(doc_id, rank), rank)
            docs.setdefault(doc_id, hit)
    order = sorted(scores, key=lambda d: (-scores[d], best_rank[d], d))
    return [ScoredDocument(document=docs[d].document, score=scores[d]) for d in order[:topk]]


class HybridBackend(Backend):
    """Dense + BM25 over the same corpus, fused with weighted RRF. A zero weight skips that backend."""

    name = "hybrid"

    def __init__(
        self,
        dense: Backend | None,
        bm25: Backend | None,
        *,
        rrf_k: float = 60.0,
        dense_weight: float = 1.0,
        bm25_weight: float = 1.0,
        depth: int = 20,
    ) -> None:
        parts = [(b, w) for b, w in ((dense, dense_weight), (bm25, bm25_weight)) if b is not None and w > 0]
        if not parts:
            raise ConfigError(
                "hybrid needs at least one of dense and bm25 with a positive weight "
                "(SEARCHRL_RETRIEVAL_HYBRID_DENSE_WEIGHT / SEARCHRL_RETRIEVAL_HYBRID_BM25_WEIGHT)"
            )
        self.dense = dense
        self.bm25 = bm25
        self._parts = parts
        self.rrf_k = rrf_k
        self.dense_weight = dense_weight
        self.bm25_weight = bm25_weight
        self.depth = depth

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> HybridBackend:
        # Imported here: the registry imports this module lazily, and the inner backends pull in torch/faiss.
        from searchrl.retrieval.backends import build_backend

        def inner(name: str, weight: float) -> Backend | None:
            if weight <= 0:
                return None
            # cache_mode off: a query cache, if any, sits in front of the hybrid, not inside it.
            return build_backend(settings.with_changes(**{"backend": name, "cache_mode": "off"}))

        return cls(
            inner("dense", settings.hybrid_dense_weight),
            inner("bm25", settings.hybrid_bm25_weight),
            rrf_k=settings.hybrid_rrf_k,
            dense_weight=settings.hybrid_dense_weight,
            bm25_weight=settings.hybrid_bm25_weight,
            depth=settings.hybrid_depth,
        )

    async def start(self) -> None:
        await asyncio.gather(*(b.start() for b, _ in self._parts))

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b, _ in self._parts))

    def attach_metrics(self, metrics: Any) -> None:
        """Forward the app's batch/cache metrics to the parts that batch (the dense one)."""
        for backend, _ in self._parts:
            attach = getattr(backend, "attach_metrics", None)
            if attach is not None:
                attach(metrics)

    def problem(self) -> str | None:
        problems = [p for p in (b.problem() for b, _ in self._parts) if p]
        return "; ".join(problems) or None

    def busy(self) -> str | None:
        loads = [p for p in (b.busy() for b, _ in self._parts) if p]
        return "; ".join(loads) or None

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "rrf_k": self.rrf_k,
            "weights": {"dense": self.dense_weight, "bm25": self.bm25_weight},
            "depth": self.depth,
            "parts": [b.info() for b, _ in self._parts],
        }

    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        depth = max(topk, self.depth)
        per_backend = await asyncio.gather(*(b.search(queries, depth) for b, _ in self._parts))
        for (backend, _), hits in zip(self._parts, per_backend, strict=True):
            if len(hits) != len(queries):
                raise BackendError(
                    f"hybrid: {backend.name} returned {len(hits)} lists for {len(queries)} queries"
                )
        weights = [w for _, w in self._parts]
        return [
            rrf_fuse([hits[i] for hits in per_backend], weights, k=self.rrf_k, topk=topk)
            for i in range(len(queries))
        ]


__all__ = ["HybridBackend", "rrf_fuse"]
