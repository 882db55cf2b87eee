"""The verl reward function: exact match on the last <answer>, plus F1, format validity and search counts.

verl loads it through `reward.custom_reward_function.path=pkg://trainer.reward` and `.name=compute_score`
(trainer/overrides.py). With a custom function set, verl routes *every* data source here, so a user's own
`data_source` scores the same way instead of hitting `default_compute_score`'s NotImplementedError.

For the seven `searchR1_*` sources the score equals verl's `search_r1_like_qa_em.compute_score` (tests compare
them): both use searchrl/scoring.py's rules. verl's NaiveRewardManager takes `score` as the reward and logs every
other key of the returned dict as `reward_extra_info`; every key must be present for every sample because verl
stacks them into arrays, so failures and missing values are numbers, never absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchrl.scoring import score_response

# The seven Search-R1 sources verl's default_compute_score routes to search_r1_like_qa_em.
SEARCH_R1_SOURCES = frozenset(
    f"searchR1_{name}"
    for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)
# Per-trajectory counters the search tool keeps in the agent loop's extra_fields (trainer/tool.py); verl merges
# them into `extra_info` before calling the reward, which is how tool metrics reach the training logs.
TOOL_COUNTERS = ("search_calls", "search_failures", "search_latency_s")


def golden_answers(ground_truth: Any) -> list[str]:
    """The target answers from `reward_model.ground_truth` ({"target": [...]}, a list, or a bare string)."""
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth.get("target", [])
    if isinstance(ground_truth, str):
        return [ground_truth]
    if ground_truth is None:
        return []
    return [str(g) for g in list(ground_truth)]  # lists and numpy arrays (parquet round trip)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score signature; `score` is the reward, the other keys are logged metrics."""
    result = score_response(solution_str, golden_answers(ground_truth))
    info = extra_info or {}
    out = {
        "score": float(result.em),
        "em": float(result.em),
        "f1": float(result.f1),
        "format_valid": float(result.format_valid),
        "has_answer": float(result.answer is not None),
    }
    for key in TOOL_COUNTERS:
        value = info.get(key)
        out[key] = float(value) if isinstance(value, int | float) else 0.0
    return out


__all__ = ["SEARCH_R1_SOURCES", "TOOL_COUNTERS", "compute_score", "golden_answers"]
