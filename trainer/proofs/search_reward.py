"""`make learn-search`'s reward: Search-R1's exact match, plus a declared format term when the run asks for one.

`score` = EM of the last `<answer>` (the production reward, trainer/plugins/reward.py, i.e. searchrl/scoring.py) +
`format_weight` x [the episode executed a well-formed search call] (verl's tool counted it: `search_calls` in the
trajectory's extra fields, a call whose JSON parsed and whose search did not fail). With `format_weight` 0
(the default) the reward is EM alone. The term's share of the reward is logged per trajectory (`format_share`)
and the run reports it, so a rise driven by the format term is never read as a rise in EM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchrl.trainer.plugins import reward


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    format_weight: float = 0.0,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score: the production reward's dict, `score` = EM + format_weight x searched."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    info = extra_info or {}
    calls, failures = info.get("search_calls"), info.get("search_failures")
    failed = failures if isinstance(failures, int | float) else 0
    searched = float(isinstance(calls, int | float) and calls - failed > 0)
    em = float(out["em"])
    bonus = format_weight * searched
    total = em + bonus
    return {**out, "score": total, "searched": searched, "format_share": bonus / total if total else 0.0}


__all__ = ["compute_score"]
