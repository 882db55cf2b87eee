"""The questions `searchrl eval` asks: QA sources resolved to a file, rows read into `QAItem`s, filtered, sampled.

QA sources: `dev` (the bundled 30-question dev set over the English Wikipedia subset), `searchr1-test` (the
Search-R1 test parquet, `PeterJinGo/nq_hotpotqa_train` `test.parquet`, ≈51k rows over the seven datasets,
fetched with huggingface_hub), or a path to a `.jsonl` / `.parquet` with `question` and `golden_answers`
(and optionally `id`, `data_source`; Search-R1's `prompt` and `reward_model` columns are read too).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.devset import dev_qa_path
from searchrl.errors import DataError
from searchrl.jsonl import jsonl_rows

SEARCHR1_REPO = "PeterJinGo/nq_hotpotqa_train"
SEARCHR1_TEST_FILE = "test.parquet"


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    golden_answers: list[str]
    data_source: str = "dev"


def _clean_source(value: Any, default: str) -> str:
    text = str(value or default)
    return text.removeprefix("searchR1_")


def _as_str_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [str(v) for v in value]


def _question_from_prompt(prompt: Any) -> str | None:
    """Search-R1 parquet rows carry the full prompt; the question follows its last 'Question:'."""
    msgs = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if not msgs:
        return None
    content = str(msgs[-1].get("content", "")) if isinstance(msgs[-1], dict) else str(msgs[-1])
    if "Question:" not in content:
        return None
    return content.rsplit("Question:", 1)[1].strip()


def _row_to_item(row: dict[str, Any], where: str, default_source: str) -> QAItem:
    question = row.get("question")
    if not question and row.get("prompt") is not None:
        question = _question_from_prompt(row["prompt"])
    golden = _as_str_list(row.get("golden_answers"))
    if not golden:
        rm = row.get("reward_model") or {}
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        golden = _as_str_list(gt.get("target") if isinstance(gt, dict) else gt)
    if not question or not golden:
        raise DataError(f"{where}: a QA row needs a non-empty 'question' and 'golden_answers'")
    source = _clean_source(row.get("data_source"), default_source)
    return QAItem(
        id=str(row.get("id") or where), question=str(question), golden_answers=golden, data_source=source
    )


def _load_jsonl(path: Path) -> list[QAItem]:
    def not_json(lineno: int, exc: json.JSONDecodeError) -> None:
        raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc

    return [_row_to_item(row, f"{path}:{lineno}", "dev") for lineno, row in jsonl_rows(path, not_json)]


def _load_parquet(path: Path) -> list[QAItem]:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read parquet ({exc})") from exc
    return [_row_to_item(row, f"{path}:row {i}", "qa") for i, row in enumerate(df.to_dict(orient="records"))]


def resolve_qa_path(source: str) -> Path:
    """The file behind a QA source name (downloading the Search-R1 test set when asked)."""
    if source == "dev":
        path = dev_qa_path()
        if path.is_file():
            return path
        raise DataError(f"the bundled dev set ({path}) is missing from this install; pass --qa <path.jsonl>")
    if source == "searchr1-test":
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(SEARCHR1_REPO, SEARCHR1_TEST_FILE, repo_type="dataset"))
        except Exception as exc:  # network, auth, missing file: all mean "cannot get the data"
            raise DataError(
                f"cannot download {SEARCHR1_REPO}/{SEARCHR1_TEST_FILE} ({exc.__class__.__name__}); "
                "download it elsewhere and pass --qa <path>.parquet"
            ) from exc
    path = Path(source)
    if not path.exists():
        raise DataError(f"QA file {source!r} not found; use dev, searchr1-test or a .jsonl/.parquet path")
    return path


def load_qa(
    source: str, *, datasets: Sequence[str] | None = None, limit: int | None = None, seed: int = 0
) -> tuple[list[QAItem], Path]:
    """QA items from a source, filtered to `datasets` and sampled to `limit` per dataset (order kept)."""
    path = resolve_qa_path(source)
    items = _load_parquet(path) if path.suffix == ".parquet" else _load_jsonl(path)
    if datasets:
        known = sorted({i.data_source for i in items})
        missing = [d for d in datasets if d not in known]
        if missing:
            raise DataError(f"no rows with data_source {missing} in {path}; it has {known}")
        items = [i for i in items if i.data_source in set(datasets)]
    if limit is not None:
        by_source: dict[str, list[int]] = defaultdict(list)
        for idx, it in enumerate(items):
            by_source[it.data_source].append(idx)
        keep: set[int] = set()
        for source, idxs in by_source.items():
            # One generator per dataset, seeded by its name: a run split by dataset draws the same questions.
            rng = random.Random(f"{seed}:{source}")
            keep.update(idxs if len(idxs) <= limit else rng.sample(idxs, limit))
        items = [it for idx, it in enumerate(items) if idx in keep]
    if not items:
        raise DataError(f"no QA rows selected from {path}")
    return items, path


__all__ = ["SEARCHR1_REPO", "SEARCHR1_TEST_FILE", "QAItem", "load_qa", "resolve_qa_path"]
