"""`make learn-cpu-real`'s reward: after the scripted search and the real tool response, the model's own turn
says something and does not invent a `<tool_response>` of its own.

SmolLM2-135M-Instruct, shown the repo's ChatML/hermes template, answers a real BM25 response by writing a fake
`<tool_response>` block full of made-up facts in about half its samples (../shared/DESIGN.md 3d: 0.562 of 80
samples scored 1, every group of 8 varied). A search agent that writes its own observations is exactly the
failure that matters: it trusts text nobody retrieved. The reward is 1 for a turn with at least one
non-space character and neither tag (`<tool_response>` or `</tool_response>`), else 0. The empty or
whitespace-only turn scores 0: without that guard the cheapest policy is to stop at once.

The own turn is the agent loop's record of the last turn the rollout server generated (trainer/plugins/agent_loop.py,
through verl's `extra_info`; trainer/proofs/learn_task.py's `own_turn`), not a split of the decoded text: splitting on the
last `</tool_response>` would score only the tail after a block the model invented (a clean tail: the cheat would
score 1). A trajectory without an environment response (verl drops one that would cross the response budget)
scores 0: there was nothing to answer.

Like trainer/proofs/learn_task.py it wraps the production reward (trainer/plugins/reward.py), so the search-failure window and
the tool counters run as on a GPU run; only `score` differs. The step's `loss/model_tool_response_tokens`
(trainer/plugins/masks.py) counts the invented spans from the tokens and turn markers, independently of this text check.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from searchrl.trainer.plugins import reward
from searchrl.trainer.proofs.learn_task import own_turn

_TAG = re.compile(r"</?tool_response>")


def invents_response(turn: str) -> bool:
    """Whether the turn writes a tool-response tag (opening or closing) itself."""
    return _TAG.search(turn) is not None


def turn_score(turn: str) -> float:
    """1.0 for a non-empty turn without an invented tool response; 0.0 otherwise ("": no environment response)."""
    if not turn.strip():
        return 0.0
    return 0.0 if invents_response(turn) else 1.0


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    random_rate: float | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score: the production reward's dict with `score` = turn_score of the own turn.

    `random_rate` (the null run, `searchrl train cpu --learn --random-reward P`): `score` is a coin flip at rate P,
    independent of the turn, so the updates are as large and as varied as a real run's but driven by nothing the
    model wrote; `no_invented_response` still holds the real score."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    real = turn_score(own_turn(extra_info))
    score = real if random_rate is None else float(_RNG.random() < random_rate)
    return {**out, "score": score, "no_invented_response": real}


_RNG = random.Random(0)


__all__ = ["compute_score", "invents_response", "turn_score"]
