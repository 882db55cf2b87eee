"""Answer extraction, SQuAD normalisation, exact match and F1: the one scorer for reward and evaluation.

Exact match follows verl's `verl.utils.reward_score.search_r1_like_qa_em` (which the Search-R1 paper's numbers
use): lower-case, strip punctuation, drop articles, collapse whitespace; score the *last* `<answer>...</answer>`
span; a response with more than 10 opening or closing answer tags earns a quarter of the score (it stops the
policy from spraying answers). Tests compare this module with verl's function on the same strings.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
MAX_ANSWER_TAGS = 10


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower, strip punctuation, remove articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def _as_list(golden: str | Iterable[str]) -> list[str]:
    if isinstance(golden, str):
        return [golden]
    return [str(g) for g in golden]


def exact_match(prediction: str, golden: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0."""
    pred = normalize_answer(prediction)
    return 1.0 if any(pred == normalize_answer(g) for g in _as_list(golden)) else 0.0


def cover_match(prediction: str, golden: str | Iterable[str]) -> float:
    """1.0 if a normalised golden answer stands, as whole words, inside the normalised prediction (Search-R1's
    `subem_check`, word-bounded): an answer that names the title inside a sentence. Reported beside EM, never a
    reward here."""
    pred = f" {normalize_answer(prediction)} "
    return 1.0 if any(g and f" {g} " in pred for g in map(normalize_answer, _as_list(golden))) else 0.0


def f1_score(prediction: str, golden: str | Iterable[str]) -> float:
    """Best token-level F1 between the prediction and any golden answer (SQuAD definition)."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for g in _as_list(golden):
        gold_tokens = normalize_answer(g).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if not pred_tokens or not gold_tokens:
            best = max(best, float(pred_tokens == gold_tokens))
            continue
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def extract_answer(response: str) -> str | None:
    """The stripped text of the last `<answer>...</answer>` span, or None when there is none."""
    matches = _ANSWER_RE.findall(response)
    return matches[-1].strip() if matches else None


@dataclass(frozen=True)
class AnswerScore:
    """Everything the reward and the evaluator log about one response."""

    answer: str | None
    em: float  # the reward: EM on the last <answer>, divided by 4 when answer tags are sprayed
    f1: float
    em_pure: float  # the paper's metric: EM on the last <answer>, no shaping (what eval reports as EM)
    format_valid: bool  # exactly one well-formed <answer> span and no stray answer tags


def score_response(response: str, golden: str | Iterable[str]) -> AnswerScore:
    """Score a full model response against golden answers; `em` matches verl's search_r1_like_qa_em."""
    answer = extract_answer(response)
    opens, closes = response.count("<answer>"), response.count("</answer>")
    if answer is None:
        return AnswerScore(answer=None, em=0.0, f1=0.0, em_pure=0.0, format_valid=False)
    em = pure = exact_match(answer, golden)
    if em and (opens > MAX_ANSWER_TAGS or closes > MAX_ANSWER_TAGS):
        em = em / 4
    return AnswerScore(
        answer=answer,
        em=em,
        f1=f1_score(answer, golden),
        em_pure=pure,
        format_valid=opens == 1 and closes == 1,
    )


__all__ = [
    "MAX_ANSWER_TAGS",
    "AnswerScore",
    "cover_match",
    "exact_match",
    "extract_answer",
    "f1_score",
    "normalize_answer",
    "score_response",
]
