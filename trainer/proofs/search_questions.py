"""`make learn-search`'s questions: reverse look-ups over the bundled corpus, built without an LLM.

Each question is a passage's first sentence with every word of its title masked, asked back as a subject:

    Which subject is described as: '___ is a large cat native to Africa and India.'?  ->  Lion

Why this kind: the answer (the passage's title) is in the search tool's response (`Doc i (Title: T) ...`, the
format training and eval share, searchrl/prompt.py) whenever the question's own text retrieves the passage, and
it is out of reach without search for a 135M model (a description of one of ten thousand articles, with the
name removed). So what a policy gains on them it gains by searching and reading, and `answer_in_observation`
(infer/summary.py) tells whether its own search found the passage.

How, deterministically (no LLM, no randomness but a fixed hash):

1. every passage whose title is 1-4 plain words (letters, digits, spaces, hyphens, apostrophes; no parenthesised
   disambiguation), and whose first sentence (up to the first ". " after at least `MIN_WORDS` words) has
   `MIN_WORDS`-`MAX_WORDS` words and contains the whole title;
2. every title word of 2 letters or more is replaced by `___` wherever it occurs in the sentence (case-insensitive,
   as a whole word); a sentence with a title word left after normalisation is dropped;
3. passages are ordered by the SHA-1 of their title (a fixed shuffle that does not follow the corpus file's
   alphabetical order), and the BM25 check (`retrieval_ranks`) keeps a question only when its own text retrieves
   its passage in the top `TOPK`; the kept share, top-1 and top-3, is reported;
4. the kept questions are split by position in that order: the first `held_out` are the held-out set (never
   trained on), the next `train` the training set.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError
from searchrl.scoring import normalize_answer

MIN_WORDS = 8
MAX_WORDS = 32
MAX_TITLE_WORDS = 4
MASK = "___"
TOPK = 3
TEMPLATE = "Which subject is described as: '{sentence}'?"
DATA_SOURCE = "reverse_lookup"
_TITLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 '\-]*$")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]])\.\s+(?=[A-Z])")


@dataclass(frozen=True)
class Question:
    """One reverse look-up: its text, its golden answer (the title) and the passage it was made from."""

    question: str
    answer: str
    passage_id: str

    def qa_row(self) -> dict[str, object]:
        """The QA-file row data prep and `searchrl eval` read."""
        return {
            "question": self.question,
            "golden_answers": [self.answer],
            "data_source": DATA_SOURCE,
            "passage_id": self.passage_id,
        }


def first_sentence(text: str) -> str:
    """The passage's first sentence: up to the first ". " followed by a capital after `MIN_WORDS` words."""
    for match in _SENTENCE_END.finditer(text):
        head = text[: match.start() + 1]
        if len(head.split()) >= MIN_WORDS:
            return head.strip()
    return text.strip()


def mask_title(sentence: str, title: str) -> str | None:
    """`sentence` with each title word (2+ characters) masked as a whole word, or None when the sentence does
    not name the whole title or a title word survives SQuAD normalisation."""
    if title.lower() not in sentence.lower():
        return None
    words = sorted({w for w in re.split(r"[\s\-]+", title) if len(w) >= 2}, key=len, reverse=True)
    if not words:
        return None
    masked = sentence
    for word in words:
        masked = re.sub(rf"(?<![\w]){re.escape(word)}(?![\w])", MASK, masked, flags=re.IGNORECASE)
    left = set(normalize_answer(masked).split())
    if any(normalize_answer(w) in left for w in words if normalize_answer(w)):
        return None
    return masked


def make_question(passage_id: str, contents: str) -> Question | None:
    """The reverse look-up of one Search-R1 passage (`"Title"\\ntext`), or None when it does not qualify."""
    from searchrl.prompt import split_title

    title, text = split_title(contents)
    if not _TITLE.match(title) or len(title.split()) > MAX_TITLE_WORDS or not normalize_answer(title):
        return None
    sentence = first_sentence(text)
    if not MIN_WORDS <= len(sentence.split()) <= MAX_WORDS:
        return None
    masked = mask_title(sentence, title)
    if masked is None or MASK not in masked:
        return None
    return Question(TEMPLATE.format(sentence=masked), title, passage_id)


def title_order(title: str) -> str:
    """The fixed shuffle key (module docstring, step 3)."""
    return hashlib.sha1(title.encode("utf-8")).hexdigest()


def candidates(corpus: Path) -> list[Question]:
    """Every qualifying question of the corpus JSONL, in the fixed order (module docstring, steps 1-3)."""
    if not corpus.is_file():
        raise ConfigError(f"corpus {corpus} does not exist: run `searchrl index` or pass --corpus")
    found = []
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                question = make_question(str(row["id"]), str(row["contents"]))
                if question is not None:
                    found.append(question)
    return sorted(found, key=lambda q: title_order(q.answer))


def retrieval_ranks(url: str, questions: Sequence[Question], topk: int = TOPK, batch: int = 64) -> list[int]:
    """Each question's passage's rank (1-based) in the service's top `topk` for the question's own text; 0 when
    it is not there."""
    import requests

    ranks = []
    for start in range(0, len(questions), batch):
        chunk = questions[start : start + batch]
        response = requests.post(
            f"{url.rstrip('/')}/retrieve",
            json={"queries": [q.question for q in chunk], "topk": topk, "return_scores": True},
            timeout=120,
        )
        response.raise_for_status()
        result = response.json()["result"]  # the retrieval contract: one list per query, best first (README)
        if len(result) != len(chunk):
            raise ConfigError(f"the service answered {len(result)} result lists for {len(chunk)} queries")
        for question, hits in zip(chunk, result, strict=True):
            ids = [str((hit.get("document") or hit)["id"]) for hit in hits]
            ranks.append(ids.index(question.passage_id) + 1 if question.passage_id in ids else 0)
    return ranks


@dataclass(frozen=True)
class QuestionSet:
    """The held-out and training questions, and how the BM25 check went on the candidates it looked at."""

    held_out: list[Question]
    train: list[Question]
    checked: int
    top1: int
    top3: int

    def line(self) -> str:
        return (
            f"questions: {self.checked} candidates checked with BM25, top-1 {self.top1 / self.checked:.3f}, "
            f"top-{TOPK} {self.top3 / self.checked:.3f} (kept: the top-{TOPK} hits); {len(self.train)} train, "
            f"{len(self.held_out)} held out"
        )


def build_questions(corpus: Path, url: str, *, train: int, held_out: int, chunk: int = 128) -> QuestionSet:
    """Check candidates in order until `held_out` + `train` retrieve their passage (module docstring)."""
    if train < 1 or held_out < 1:
        raise ConfigError(f"--train-questions {train}, --held-out {held_out}: both must be at least 1")
    pool = candidates(corpus)
    kept: list[Question] = []
    checked = top1 = top3 = 0
    for start in range(0, len(pool), chunk):
        part = pool[start : start + chunk]
        ranks = retrieval_ranks(url, part)
        for question, rank in zip(part, ranks, strict=True):
            checked += 1
            top1 += rank == 1
            top3 += rank > 0
            if rank > 0:
                kept.append(question)
            if len(kept) == train + held_out:
                return QuestionSet(kept[:held_out], kept[held_out:], checked, top1, top3)
    raise ConfigError(
        f"the corpus has {len(kept)} reverse look-ups that BM25 retrieves ({checked} candidates): fewer than "
        f"{train} + {held_out} asked"
    )


def copied_openings(
    corpus: Path, questions: Sequence[Question], tokenizer: Any, max_tokens: int
) -> list[str]:
    """What a policy that answers with its passage's first sentence, word for word, would answer under an answer
    cap of `max_tokens` (the declared environment's `--answer-tokens`): the sentence's first `max_tokens` tokens
    (after a space, as after `<answer>`), cut at the first newline or `<` as the environment cuts. Their EM is what
    the cut alone gives a perfect copier, the context a rise in EM under the cap is read against."""
    wanted = {q.passage_id for q in questions}
    texts: dict[str, str] = {}
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                if str(row["id"]) in wanted:
                    texts[str(row["id"])] = str(row["contents"])
    from searchrl.prompt import split_title

    answers = []
    for q in questions:
        sentence = first_sentence(split_title(texts[q.passage_id])[1])
        ids = tokenizer.encode(" " + sentence, add_special_tokens=False)[:max_tokens]
        answers.append(re.split(r"[\n<]", tokenizer.decode(ids), maxsplit=1)[0])
    return answers


def write_qa(path: Path, questions: Iterable[Question]) -> Path:
    """A QA JSONL file of the questions (question, golden_answers, data_source, passage_id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(q.qa_row(), ensure_ascii=False) + "\n" for q in questions), encoding="utf-8"
    )
    return path


__all__ = [
    "DATA_SOURCE",
    "MASK",
    "TEMPLATE",
    "Question",
    "QuestionSet",
    "build_questions",
    "candidates",
    "copied_openings",
    "first_sentence",
    "make_question",
    "mask_title",
    "retrieval_ranks",
    "title_order",
    "write_qa",
]
