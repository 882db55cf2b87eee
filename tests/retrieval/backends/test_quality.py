"""Retrieval quality on the bundled corpus: recall@3 by supporting title on searchrl/data/dev_qa.jsonl.

Indexes the FULL bundled corpus (10,033 passages) into the repo's `data/` (gitignored) through
`ensure_index`, exactly where `make serve-retrieval` looks, so the first run pays the build (BM25 ~5 s;
dense MiniLM several minutes on 2 CPU cores) and every later run, and the service, reuse it.

recall@k = mean over questions of (supporting titles found in the top k) / (supporting titles); 22 of the 30
questions have one supporting title, 8 (two-hop) have two. Titles, not answer strings: years and names also
occur in unrelated passages (DESIGN.md section 5).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import DEV_QA, REPO

pytestmark = pytest.mark.slow

K = 3
# Measured on this machine (2 CPU cores, 2026-11-22; bundled corpus, 30 dev questions, `-s` prints them):
#   bm25  recall@3 0.933, any supporting title in top 3 0.967
#   dense recall@3 0.867, any supporting title in top 3 0.933   (bundled MiniLM, Flat)
# Floors sit a little under the measurements (one more missed title costs 0.017-0.033).
FLOORS = {"bm25": 0.88, "dense": 0.80}


def _title(contents: str) -> str:
    return contents.split("\n", 1)[0].strip().strip('"')


def recall_at_k(backend_name: str, k: int = K) -> tuple[float, float]:
    """(title recall@k, share of questions with any supporting title in the top k)."""
    questions = [json.loads(line) for line in DEV_QA.read_text(encoding="utf-8").splitlines() if line.strip()]
    settings = RetrievalSettings(backend=backend_name, corpus="bundled", data_dir=REPO / "data", topk=k)

    async def run() -> list[list[str]]:
        backend = build_backend(settings)
        await backend.start()
        try:
            hits = await backend.search([q["question"] for q in questions], k)
        finally:
            await backend.close()
        return [[_title(h.document.contents) for h in per_query] for per_query in hits]

    titles = asyncio.run(run())
    recalls, any_hit = [], []
    for q, got in zip(questions, titles, strict=True):
        wanted = set(q["supporting_titles"])
        found = wanted & set(got[:k])
        recalls.append(len(found) / len(wanted))
        any_hit.append(bool(found))
    return sum(recalls) / len(recalls), sum(any_hit) / len(any_hit)


# The first dense run encodes 10,033 passages: 949 s measured on this (busy) 2-core machine, past the
# suite's 900 s default timeout.
# bm25 builds in seconds and runs in make test; dense is opt-in with the hybrid recall test (make test-quality,
# tests/retrieval/backends/test_hybrid.py says why)
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("backend_name", ["bm25", pytest.param("dense", marks=pytest.mark.quality)])
def test_recall_at_3_on_dev_qa(backend_name: str) -> None:
    recall, hit_rate = recall_at_k(backend_name)
    print(f"\n{backend_name}: recall@{K} = {recall:.3f} (any supporting title in top {K}: {hit_rate:.3f})")
    assert recall >= FLOORS[backend_name], (
        f"{backend_name} recall@{K} {recall:.3f} < floor {FLOORS[backend_name]}"
    )
