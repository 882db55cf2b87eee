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

With `format_weight` 0 the reward is EM alone. The term's share of the reward is logged per trajectory (`format_share`)
and the run reports it, so a rise driven by the format term is never read as a rise in EM.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from searchrl.scoring import normalize_answer
from searchrl.trainer.plugins import reward

FORMAT_TERMS = ("searched", "retrieved", "retrieved+f1")
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)


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
    em = float(out["em"])
    term = {"searched": searched, "retrieved": found, "retrieved+f1": (found + float(out["f1"])) / 2}[
        format_term
    ]
    bonus = format_weight * term
    total = em + bonus
    share = bonus / total if total else 0.0
    return {**out, "score": total, "searched": searched, "retrieved": found, "format_share": share}


__all__ = ["FORMAT_TERMS", "compute_score", "retrieved"]
