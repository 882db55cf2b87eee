"""`make bench-quality` tables: n, 95% intervals, and the paired test that decides whether backends differ."""

from __future__ import annotations

from searchrl.retrieval.index.recall import RecallResult, format_table, pairwise_table
from searchrl.stats import bootstrap_ci


def _result(name: str, found: list[float]) -> RecallResult:
    missed = tuple(f"q{i}" for i, f in enumerate(found) if not f)
    recall = sum(found) / len(found)
    return RecallResult(
        name, 3, len(found), recall, recall, 0.1, missed,
        recall_ci=bootstrap_ci(found), all_recall_ci=bootstrap_ci(found), found=tuple(found),
    )  # fmt: skip


def test_table_has_n_and_intervals() -> None:
    bm25 = _result("bm25", [1.0] * 29 + [0.0])
    table = format_table([bm25])
    assert "| k | n |" in table and "| bm25 | 0.967 [0.90, 1.00] |" in table and "| 3 | 30 |" in table


def test_one_question_apart_is_not_a_ranking() -> None:
    """The README's case: hybrid 30/30 vs bm25 29/30 on the same questions."""
    bm25 = _result("bm25", [1.0] * 29 + [0.0])
    hybrid = _result("hybrid", [1.0] * 30)
    far = _result("weak", [1.0] * 10 + [0.0] * 20)
    rows = pairwise_table([bm25, hybrid, far]).splitlines()
    assert rows[2].startswith("| bm25 vs hybrid | +0.033 |") and rows[2].endswith("| 1 | 0 | 1 |")
    weak_vs_hybrid = next(r for r in rows if r.startswith("| hybrid vs weak"))
    assert float(weak_vs_hybrid.rsplit("|", 2)[1]) < 0.05  # 20 questions apart: that one separates
