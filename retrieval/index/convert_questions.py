"""The questions a conversion measures recall on, as vectors from the index's own encoder (index/convert.py).

Real questions, a few hundred: a given file, Search-R1's NQ+HotpotQA train questions for wiki18*, or the dev
questions plus corpus-derived ones otherwise; passage vectors only as a labelled fallback when the encoder cannot
load.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from searchrl.errors import ConfigError, first_line
from searchrl.retrieval.index.build import NAMED_CORPORA
from searchrl.retrieval.index.convert_plan import SEED, Source

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

QUESTIONS_REPO = "PeterJinGo/nq_hotpotqa_train"  # Search-R1's training questions (NQ + HotpotQA train)


def question_texts(
    settings: RetrievalSettings, corpus_path: Path, n: int, questions: Path | None
) -> tuple[list[str], str]:
    """(up to n questions, where they come from): a given file, Search-R1's training questions for wiki18*, or the
    dev questions plus corpus-derived ones (retrieval/queries.py)."""
    import random

    if questions is not None:
        texts = _read_questions(questions)
        label = f"questions from {questions.name}"
    elif settings.corpus.strip() in NAMED_CORPORA:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(
                hf_hub_download(repo_id=QUESTIONS_REPO, filename="train.parquet", repo_type="dataset")
            )
            texts = _read_questions(path)
            label = f"Search-R1 NQ+HotpotQA train questions ({QUESTIONS_REPO})"
        except Exception as exc:  # noqa: BLE001 - any download failure falls back to the next source, logged
            log.warning(
                "Search-R1's train questions unavailable (%s); using dev + corpus-derived questions",
                first_line(exc),
            )
            texts, label = [], ""
        if texts:
            rng = random.Random(SEED)
            return rng.sample(texts, min(n, len(texts))), label
    else:
        texts = []
    if not texts:
        from searchrl.retrieval.queries import sample_queries

        texts = sample_queries(corpus_path, limit=n)
        label = "dev questions + questions from corpus titles and sentences (retrieval/queries.py)"
    return texts[:n], label


def _read_questions(path: Path) -> list[str]:
    """The `question` column of a parquet file, or field of a JSONL file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [str(q) for q in pq.read_table(path, columns=["question"]).column("question").to_pylist() if q]
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(str(json.loads(line)["question"]))
    if not out:
        raise ConfigError(f"--questions {path}: no rows with a `question` field")
    return out


def encode_questions(
    settings: RetrievalSettings, source: Source, n: int, questions: Path | None
) -> tuple[np.ndarray, str]:
    """Question vectors from the index's own encoder on CPU (fp32), or passage vectors as a labelled fallback."""
    from searchrl.retrieval.encoders.encoder import Encoder

    texts, label = question_texts(settings, source.corpus_path, n, questions)
    try:
        encoder = Encoder.load(
            source.encoder.name, device="cpu", precision="fp32", max_length=settings.encoder_max_length
        )
        vectors = np.ascontiguousarray(encoder.encode_queries(texts), dtype=np.float32)
        del encoder
        return vectors, f"{label}, encoded with {source.encoder.name} on CPU"
    except (OSError, ImportError, ConfigError, ValueError) as exc:
        log.warning(
            "encoder %s unavailable (%s): recall uses passage vectors", source.encoder.name, first_line(exc)
        )
        count = source.flat.count
        rows = np.sort(np.random.default_rng(SEED + 1).choice(count, size=min(n, count), replace=False))
        return source.flat.rows(
            rows
        ), f"passage vectors (FALLBACK: encoder {source.encoder.name} unavailable)"


__all__ = ["QUESTIONS_REPO", "encode_questions", "question_texts"]
