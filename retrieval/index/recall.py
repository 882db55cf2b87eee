"""Retrieval quality on a QA set with supporting titles: recall@k per backend, as a table.

    searchrl index recall --backends dense,bm25,hybrid --k 3     # make bench-quality

A question counts as recalled when any of its `supporting_titles` is the title of one of the top-k passages
(DESIGN.md 5: "answer string in top k" overstates quality, because years and names also occur in unrelated
passages). `all_recall` is the stricter share where every supporting title is in the top k (multi-hop rows).

Every recall comes with n and a 95% bootstrap interval, and `pairwise_table` tests each pair of backends on
the same questions (McNemar's exact test, searchrl/stats.py). With the 30 dev questions one question is 3.3
points and the intervals are about +-0.1 wide: rank backends only where the test separates them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import DataError
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings
from searchrl.stats import bootstrap_ci, paired_comparison


@dataclass(frozen=True)
class QARow:
    id: str
    question: str
    supporting_titles: tuple[str, ...]


@dataclass(frozen=True)
class RecallResult:
    backend: str
    k: int
    questions: int
    recall: float  # share of questions with any supporting title in the top k
    all_recall: float  # share with every supporting title in the top k
    seconds: float  # search time for the whole set (start-up excluded)
    missed: tuple[str, ...]  # ids of questions with no supporting title in the top k
    recall_ci: tuple[float, float] = (float("nan"), float("nan"))  # 95% bootstrap interval of `recall`
    all_recall_ci: tuple[float, float] = (float("nan"), float("nan"))
    found: tuple[float, ...] = ()  # per question, in QA order: 1.0 if any supporting title is in the top k


def load_qa(path: Path) -> list[QARow]:
    """Rows of a QA JSONL with `id`, `question` and a non-empty `supporting_titles` list."""
    rows: list[QARow] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"cannot read QA file {path}: {exc}") from exc
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            titles = tuple(row["supporting_titles"])
            rows.append(QARow(str(row["id"]), str(row["question"]), titles))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path}:{n}: not a QA row with id, question, supporting_titles ({exc})") from exc
        if not titles:
            raise DataError(f"{path}:{n}: supporting_titles is empty")
    if not rows:
        raise DataError(f"{path} has no QA rows")
    return rows


def title_of(hit: ScoredDocument) -> str:
    """The passage title: the first line of Search-R1 `contents`, without its quotes."""
    return hit.document.contents.split("\n", 1)[0].strip().strip('"')


def score_recall(
    rows: Sequence[QARow], hits: Sequence[Sequence[ScoredDocument]], k: int
) -> tuple[float, float, list[str]]:
    """(any-title recall, all-titles recall, ids missed) of `hits` (one list per row) at k."""
    any_hits = all_hits = 0
    missed: list[str] = []
    for row, per_query in zip(rows, hits, strict=True):
        titles = {title_of(h) for h in per_query[:k]}
        found = [t in titles for t in row.supporting_titles]
        any_hits += any(found)
        all_hits += all(found)
        if not any(found):
            missed.append(row.id)
    return any_hits / len(rows), all_hits / len(rows), missed


async def _measure(settings: RetrievalSettings, rows: Sequence[QARow], k: int) -> RecallResult:
    from searchrl.retrieval.backends import build_backend

    backend = build_backend(settings)
    await backend.start()
    try:
        started = time.perf_counter()
        hits = await backend.search([r.question for r in rows], k)
        seconds = time.perf_counter() - started
    finally:
        await backend.close()
    recall, all_recall, missed = score_recall(rows, hits, k)
    missed_ids = set(missed)
    found = tuple(0.0 if r.id in missed_ids else 1.0 for r in rows)
    all_found = [
        float(all(t in {title_of(h) for h in per_q[:k]} for t in r.supporting_titles))
        for r, per_q in zip(rows, hits, strict=True)
    ]
    return RecallResult(
        settings.backend,
        k,
        len(rows),
        recall,
        all_recall,
        seconds,
        tuple(missed),
        recall_ci=bootstrap_ci(found),
        all_recall_ci=bootstrap_ci(all_found),
        found=found,
    )


def measure_recall(settings: RetrievalSettings, rows: Sequence[QARow], k: int = 3) -> RecallResult:
    """Build, start and query the backend `settings` names, then score its top-k against `rows`."""
    return asyncio.run(_measure(settings, rows, k))


def _ci(value: float, ci: tuple[float, float]) -> str:
    if ci[0] != ci[0]:  # nan: no per-question data
        return f"{value:.3f}"
    return f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def format_table(results: Sequence[RecallResult]) -> str:
    """A Markdown table, one row per backend: recall with its 95% bootstrap interval and n."""
    lines = [
        "| backend | recall@k (any title) [95% CI] | recall@k (all titles) [95% CI] | k | n | search s | missed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {_ci(r.recall, r.recall_ci)} | {_ci(r.all_recall, r.all_recall_ci)} | {r.k} | "
            f"{r.questions} | {r.seconds:.2f} | {' '.join(r.missed) or '-'} |"
        )
    return "\n".join(lines)


def pairwise_table(results: Sequence[RecallResult]) -> str:
    """Each pair of backends on the same questions: recall difference, paired 95% CI, McNemar p."""
    lines = [
        "| A vs B | recall B - A | 95% CI | only B found | only A found | McNemar p |",
        "|---|---|---|---|---|---|",
    ]
    for i, a in enumerate(results):
        for b in results[i + 1 :]:
            if not a.found or len(a.found) != len(b.found):
                continue
            c = paired_comparison(a.found, b.found)
            lines.append(
                f"| {a.backend} vs {b.backend} | {c.diff:+.3f} | [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}] | {c.b_only} | "
                f"{c.a_only} | {c.p_value:.3g} |"
            )
    return "\n".join(lines)


def as_dict(result: RecallResult) -> dict[str, Any]:
    return {
        **result.__dict__,
        "missed": list(result.missed),
        "recall_ci": list(result.recall_ci),
        "all_recall_ci": list(result.all_recall_ci),
        "found": list(result.found),
    }


__all__ = [
    "QARow",
    "RecallResult",
    "format_table",
    "load_qa",
    "measure_recall",
    "pairwise_table",
    "score_recall",
    "title_of",
]
