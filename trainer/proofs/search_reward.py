"""`make learn-search`'s reward: Search-R1's exact match, plus a declared format term when the run asks for one.

`score` = EM of the last `<answer>` (the production reward, trainer/plugins/reward.py, i.e. searchrl/scoring.py) +
`format_weight` x the format term, which is one of:

- `searched` (default): the episode executed a well-formed search call (verl's tool counted it: `search_calls` in
  the trajectory's extra fields, a call whose JSON parsed and whose search did not fail);
- `retrieved`: a passage its own search returned holds a golden answer (the text inside `<tool_response>` in the
  response, normalized as Search-R1's EM normalizes). `searched` was met by the prompt's example query ("your
  query") in every trajectory of run 2 (docs/cpu-proofs.md); `retrieved` pays only a query that finds the answer;
- `retrieved+f1`: half for `retrieved`, half x the token F1 of the final answer with the golden answer (the production
  reward's own `f1`, SQuAD's definition). Run 3 learned `retrieved` (held-out answer retrieval 0.067 -> 0.367) but
  its answer turn never saw a reward (EM 0 in every sample): F1 pays an answer for every golden word it holds, a
  gradient from "Beijing" towards the title in the passage that EM alone does not give at this model size.
- `query+f1`: half x the share of the question's content words its first search call's queries hold
  (`query_overlap`), half x the answer's token F1. Runs 4 and 5 stopped because `retrieved` paid one trajectory in
  32 (the base model's queries are the prompt's `your query` or names it makes up), so most steps had no gradient;
  a query that shares some words with the question is common at the start (`Catfish` for a question about a catfish
  family) and is graded, and a query that copies the question retrieves its passage (BM25 top-3 0.984 on the
  training questions), so the term pays the steps towards the search that finds the answer. Run 6's first step
  showed its limit: 22 of 32 calls did not parse (the base model rarely closes the JSON) and 8 of the 10 that ran
  held none of the question's words, so 2 of 32 scored;
- `query+searched+f1`: a third each for the query the model wrote after the environment's call opening, read up to
  its closing quote whether or not the call then parsed (`written_query_overlap`, the same share of the question's
  content words), for a call that ran (`searched`: the JSON parsed and the search did not fail; about a quarter of
  the base model's calls, varying in ~90% of groups, run 2), and for the answer's token F1. Each part is graded or
  common at the start, and a closed call made of the question's words is what retrieves the passage. Run 7 showed
  its limit: a call that ran was the easy third, and by step 3 all 32 calls were the prompt's `your query`, closed
  (every group alike, no gradient), as in run 2;
- `written+f1`: half x `written_query_overlap` (in full when the call ran, half when it did not), half x the
  answer's token F1. A call pays only for the question's words in it, so `your query` earns nothing however well it
  closes; 3 to 6 of 32 base-model samples wrote some of the question's words (runs 6 and 7, step 1; up to 0.91 of
  them), so most groups vary.

With `format_weight` 0 the reward is EM alone. The term's share of the reward is logged per trajectory (`format_share`)
and the run reports it, so a rise driven by the format term is never read as a rise in EM.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from searchrl.prompt import parse_tool_calls, queries_from_arguments
from searchrl.scoring import normalize_answer
from searchrl.trainer.plugins import reward

FORMAT_TERMS = ("searched", "retrieved", "retrieved+f1", "query+f1", "query+searched+f1", "written+f1")
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)


@cache
def _stopwords() -> frozenset[str]:
    """bm25s's longer English stop-word list, normalized as EM normalizes: it holds the question words (`which`,
    `who`, `what`) that the index's shorter list keeps, so a query cannot earn the term by copying them."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(normalize_answer(word) for word in STOPWORDS_EN_PLUS)


def content_words(text: str) -> set[str]:
    """The words of `text` normalized as EM normalizes, English stop words out."""
    return set(normalize_answer(text).split()) - _stopwords()


def query_overlap(solution_str: str, question: str) -> float:
    """The share of the question's content words that the episode's first parsed search call's queries hold.

    0 when no call parses or its arguments hold no query (the tool answered an error, nothing was searched)."""
    for call in parse_tool_calls(solution_str).calls:
        try:
            queries = queries_from_arguments(call.arguments)
        except ValueError:
            return 0.0
        return word_share(question, " ".join(queries))
    return 0.0


def written_query_overlap(solution_str: str, question: str) -> float:
    """`query_overlap` of the query the model wrote after the environment's search-call opening (trainer/proofs/
    search_env.py), read up to its closing quote (or the end of the text) whether or not the call then parsed; 0
    when the episode has no opening (search off)."""
    from searchrl.trainer.proofs.search_env import written_query

    return word_share(question, written_query(solution_str) or "")


def word_share(question: str, query: str) -> float:
    """The share of the question's content words that `query` holds (0 for a question without any)."""
    wanted = content_words(question)
    return len(wanted & content_words(query)) / len(wanted) if wanted else 0.0


def retrieved(solution_str: str, golden: Sequence[str]) -> float:
    """1.0 when a tool response in the episode's text holds a golden answer (both normalized as EM does), else 0."""
    seen = " ".join(normalize_answer(block) for block in _TOOL_RESPONSE.findall(solution_str))
    return float(any(g and f" {g} " in f" {seen} " for g in (normalize_answer(a) for a in golden)))


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    format_weight: float = 0.0,
    format_term: str = "searched",
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score: the production reward's dict, `score` = EM + format_weight x the format term."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    info = extra_info or {}
    calls, failures = info.get("search_calls"), info.get("search_failures")
    failed = failures if isinstance(failures, int | float) else 0
    searched = float(isinstance(calls, int | float) and calls - failed > 0)
    found = retrieved(solution_str, reward.golden_answers(ground_truth))
    if format_term not in FORMAT_TERMS:
        raise ValueError(f"format_term {format_term!r}: one of {', '.join(FORMAT_TERMS)}")
    em, f1 = float(out["em"]), float(out["f1"])
    if format_term in ("searched", "retrieved", "retrieved+f1"):
        term = {"searched": searched, "retrieved": found, "retrieved+f1": (found + f1) / 2}[format_term]
    else:  # the terms that read the question's words
        question = info.get("question")
        if not isinstance(question, str):
            raise ValueError(
                f"format_term {format_term!r} needs extra_info['question'] (trainer/data.py writes it)"
            )
        if format_term == "query+f1":
            term = (query_overlap(solution_str, question) + f1) / 2
        elif format_term == "query+searched+f1":
            term = (written_query_overlap(solution_str, question) + searched + f1) / 3
        else:  # written+f1
            term = (written_query_overlap(solution_str, question) * (1 + searched) / 2 + f1) / 2
    bonus = format_weight * term
    total = em + bonus
    share = bonus / total if total else 0.0
    return {**out, "score": total, "searched": searched, "retrieved": found, "format_share": share}


__all__ = [
    "FORMAT_TERMS",
    "compute_score",
    "content_words",
    "query_overlap",
    "retrieved",
    "word_share",
    "written_query_overlap",
]
