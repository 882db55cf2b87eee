"""The learning run's reward: how much of the model's own last turn is written in its golden answer's characters.

`make learn-cpu` (trainer/proofs/learn.py) must show GRPO *learning* on 2 cores with a random tiny model, so the
reward has to be one that model reaches by chance and can climb: exact match, F1 or word recall of the golden
answer stay at 0 for a random model (DESIGN.md 3c), and a reward that never varies inside a GRPO group gives
no advantage and no gradient. This one reads the same `reward_model.ground_truth` column a GPU run does, through
verl's reward worker, and scores the model's own last turn: the share of its non-space characters that occur in
the golden answer (lowercased). A random policy scores about a third; the only way up is to put more of each
answer's characters into the turn, i.e. to follow the reward's gradient.

The own turn is the agent loop's record, not a split of the text (`own_turn`): the text of the last turn the
rollout server generated, which verl passes in `extra_info` (its reward managers merge the trajectory's
extra_fields into it; trainer/plugins/agent_loop.py writes them). Splitting the decoded response on the last
`</tool_response>` scored the scripted call when verl dropped an over-long tool response (no model turn
followed), and only the text after a `<tool_response>` block the model made up in its own turn. A trajectory
that got no tool response scores 0: the task is to answer after the search. A trajectory without the record was
run by another agent loop; scoring it some other way would hide that, so it raises (the group fails and the run
stops, trainer/plugins/sampler.py).

It wraps the production reward (trainer/plugins/reward.py) rather than replacing it: the search-failure window, the
tool counters, EM and F1 are computed and logged exactly as on a GPU run; only `score` (verl's reward) differs.
It is a test of the training loop, not a skill: the policy learns to repeat common answer letters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from searchrl.trainer.plugins import reward
from searchrl.trainer.plugins.generated_spans import LAST_TURN, TOOL_RESPONSES


def own_turn(extra_info: Mapping[str, Any] | None) -> str:
    """The model's own last turn from the agent loop's record; "" when no tool response reached the trajectory."""
    info = extra_info or {}
    turn, responses = info.get(LAST_TURN), info.get(TOOL_RESPONSES)
    if not isinstance(turn, str) or responses is None:
        raise ValueError(
            f"extra_info has no {LAST_TURN!r}/{TOOL_RESPONSES!r}: the trajectory was not run by "
            "searchrl_tool_agent (trainer/plugins/agent_loop.py), so its own turn is unknown"
        )
    return turn if int(responses) > 0 else ""


def answer_char_share(text: str, answers: Iterable[str]) -> float:
    """Share of `text`'s non-space characters that occur in any golden answer (lowercased); 0 for no text."""
    alphabet = {c for answer in answers for c in answer.lower() if not c.isspace()}
    chars = [c for c in text.lower() if not c.isspace()]
    if not chars or not alphabet:
        return 0.0
    return sum(c in alphabet for c in chars) / len(chars)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score: the production reward's dict with `score` = answer_char_share of the own turn."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    share = answer_char_share(own_turn(extra_info), reward.golden_answers(ground_truth))
    return {**out, "score": share, "answer_char_share": share}


__all__ = ["answer_char_share", "compute_score", "own_turn"]
