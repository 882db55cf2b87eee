"""Distinct, realistic queries drawn from a corpus: what the encoder quality gate and the benchmarks send.

The dev QA questions (package data, so also inside the Docker image) come first, then questions built from corpus titles and
sentences (first 6-14 words of a sentence), in a fixed shuffled order, so the bundled 10k corpus yields ~40k
distinct strings. `limit` stops reading the corpus early: wiki-18 has 21M rows and start-up needs hundreds.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from searchrl.devset import dev_qa_path

DEV_QA = dev_qa_path()

_SENT = re.compile(r"(?<=[.!?])\s+")
_TEMPLATES = ("What is {t}?", "Who or what is {t}", "{t} history", "Tell me about {t}", "{t} facts")


def sample_queries(
    corpus_path: Path, qa_path: Path | None = DEV_QA, *, seed: int = 0, limit: int | None = None
) -> list[str]:
    """QA questions first, then title and sentence queries from the corpus; all distinct.

    With `limit`, at most that many are returned and the corpus is read only until there are enough.
    """
    out: list[str] = []
    if qa_path is not None and qa_path.is_file():
        for line in qa_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(str(json.loads(line)["question"]))
    rng = random.Random(seed)
    derived: list[str] = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            contents = json.loads(line)["contents"]
            head, _, text = contents.partition("\n")
            title = head.strip().strip('"')
            derived.append(rng.choice(_TEMPLATES).format(t=title))
            for sent in _SENT.split(text)[1:4]:  # the first sentence restates the title; use the next ones
                words = sent.split()
                if len(words) >= 6:
                    derived.append(" ".join(words[: rng.randint(6, 14)]))
            if limit is not None and len(derived) >= 2 * limit:
                break
    rng.shuffle(derived)
    seen: set[str] = set()
    unique: list[str] = []
    for q in out + derived:
        if q not in seen:
            seen.add(q)
            unique.append(q)
    return unique[:limit] if limit is not None else unique


__all__ = ["DEV_QA", "sample_queries"]
