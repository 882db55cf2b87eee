"""The proof tasks' rewards: what `make learn-cpu` and `make learn-cpu-real` pay for the model's own last turn.

Both wrap the production reward (trainer/plugins/reward.py) rather than replace it: the search-failure window, the
tool counters, EM and F1 are computed and logged exactly as on a GPU run; only `score` (verl's reward) differs.
verl loads each by name from this module (`reward.custom_reward_function.path=pkg://searchrl.trainer.proofs.rewards`
and `.name`: trainer/proofs/learn.py, trainer/proofs/real_learn.py).

**The own turn** is the agent loop's record, not a split of the text (`own_turn`): the text of the last turn the
rollout server generated, which verl passes in `extra_info` (its reward managers merge the trajectory's
extra_fields into it; trainer/plugins/agent_loop.py writes them). Splitting the decoded response on the last
`</tool_response>` scored the scripted call when verl dropped an over-long tool response (no model turn followed),
and only the text after a `<tool_response>` block the model made up in its own turn (a clean tail: that cheat would
score 1 in `make learn-cpu-real`). A trajectory that got no tool response scores 0: the task is to answer after the
search. A trajectory without the record was run by another agent loop; scoring it some other way would hide that,
so it raises (the group fails and the run stops, trainer/plugins/sampler.py).

**`answer_chars_reward`** (`make learn-cpu`, trainer/proofs/learn.py) must show GRPO *learning* on 2 cores with a
random tiny model, so the reward has to be one that model reaches by chance and can climb: exact match, F1 or word
recall of the golden answer stay at 0 for a random model (DESIGN.md 3c), and a reward that never varies inside a
GRPO group gives no advantage and no gradient. It reads the same `reward_model.ground_truth` column a GPU run does
and scores the share of the own turn's non-space characters that occur in the golden answer (lowercased). A random
policy scores about a third; the only way up is to put more of each answer's characters into the turn. It is a
test of the training loop, not a skill: the policy learns to repeat common answer letters.

**`clean_turn_reward`** (`make learn-cpu-real`, trainer/proofs/real_learn.py): after the scripted search and the
real tool response, the own turn says something and does not invent a `<tool_response>` of its own.
SmolLM2-135M-Instruct, shown the repo's ChatML/hermes template, answers a real BM25 response by writing a fake
`<tool_response>` block full of made-up facts in about half its samples (../shared/DESIGN.md 3d: 0.562 of 80
samples scored 1, every group of 8 varied). A search agent that writes its own observations is exactly the failure
that matters: it trusts text nobody retrieved. 1 for a turn with at least one non-space character and neither tag
(`<tool_response>` or `</tool_response>`), else 0; the empty or whitespace-only turn scores 0, since without that
guard the cheapest policy is to stop at once. The step's `loss/model_tool_response_tokens` (trainer/plugins/masks.py)
counts the invented spans from the tokens and turn markers, independently of this text check.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from searchrl.trainer.plugins import reward
from searchrl.trainer.plugins.generated_spans import LAST_TURN, TOOL_RESPONSES

_TAG = re.compile(r"</?tool_response>")
_RNG = random.Random(0)


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


def answer_chars_reward(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """`make learn-cpu`'s compute_score: the production reward's dict with `score` = answer_char_share of the own
    turn."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    share = answer_char_share(own_turn(extra_info), reward.golden_answers(ground_truth))
    return {**out, "score": share, "answer_char_share": share}


def invents_response(turn: str) -> bool:
    """Whether the turn writes a tool-response tag (opening or closing) itself."""
    return _TAG.search(turn) is not None


def turn_score(turn: str) -> float:
    """1.0 for a non-empty turn without an invented tool response; 0.0 otherwise ("": no environment response)."""
    if not turn.strip():
        return 0.0
    return 0.0 if invents_response(turn) else 1.0


def clean_turn_reward(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    random_rate: float | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """`make learn-cpu-real`'s compute_score: the production reward's dict with `score` = turn_score of the own turn.

    `random_rate` (the null run, `searchrl train cpu --learn --random-reward P`): `score` is a coin flip at rate P,
    independent of the turn, so the updates are as large and as varied as a real run's but driven by nothing the
    model wrote; `no_invented_response` still holds the real score."""
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    real = turn_score(own_turn(extra_info))
    score = real if random_rate is None else float(_RNG.random() < random_rate)
    return {**out, "score": score, "no_invented_response": real}


__all__ = [
    "answer_char_share",
    "answer_chars_reward",
    "clean_turn_reward",
    "invents_response",
    "own_turn",
    "turn_score",
]
