"""The learning run's reward: how much of the model's own last turn is written in its golden answer's characters.

`make learn-cpu` (trainer/cpu_learn.py) must show GRPO *learning* on 2 cores with a random tiny model, so the
reward has to be one that model reaches by chance and can climb: exact match, F1 or word recall of the golden
answer stay at 0 for a random model (DESIGN.md 3c), and a reward that never varies inside a GRPO group gives
no advantage and no gradient. This one reads the same `reward_model.ground_truth` column a GPU run does, through
verl's reward worker, and scores the text the model sampled after the last tool response: the share of its
non-space characters that occur in the golden answer (lowercased). A random policy scores about a third; the
only way up is to put more of each answer's characters into the turn, i.e. to follow the reward's gradient.

It wraps the production reward (trainer/reward.py) rather than replacing it: the search-failure window, the
tool counters, EM and F1 are computed and logged exactly as on a GPU run; only `score` (verl's reward) differs.
It is a test of the training loop, not a skill: the policy learns to repeat common answer letters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from searchrl.trainer import reward

TOOL_RESPONSE_END = "</tool_response>"
# verl decodes the response without special tokens, so the next assistant turn opens with its role word
_ROLE = re.compile(r"^\s*assistant\s*")


def own_turn(solution_str: str) -> str:
    """The text the model wrote after the last tool response (all of it when there was none)."""
    _, _, tail = solution_str.rpartition(TOOL_RESPONSE_END)
    return _ROLE.sub("", tail, count=1)


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
    share = answer_char_share(own_turn(solution_str), reward.golden_answers(ground_truth))
    return {**out, "score": share, "answer_char_share": share}


__all__ = ["answer_char_share", "compute_score", "own_turn"]
