"""`make learn-search`'s declared environment: two scripted openings, the same in training and in evaluation.

SmolLM2-135M-Instruct never writes a `<tool_call>` or an `<answer>` of its own (DESIGN.md 3d and 5d: 0 of 240
and 0 of 80 samples), so GRPO would have no reward variance to learn from. The environment therefore writes
two openings, as text the policy did not choose (loss mask 0 in training):

- where the model's **first turn** opens, with search on: the start of a search call,
  `<tool_call>\\n{"name": "search", "arguments": {"query_list": ["` (the CPU runs' own `search_call_opening`,
  trainer/cpu/scripted_agent_loop.py). The model writes the query and closes the call; the search tool runs it
  against the service and the response comes back as a tool turn;
- where a turn opens **after a tool response**, or the first turn with search off: `<answer>`. The model writes
  the answer and closes it; Search-R1's exact match (searchrl/scoring.py) scores the last `<answer>`.

Optionally (`close_answer`, declared by the run's `--close-answer`) the answer turn ends at the first newline or
`<` the model writes and the environment closes the answer (`closed_answer`): the model then has to write the
answer first, not to remember the closing tag.

What the policy decides is therefore the query and the answer: whether its query retrieves the passage, and
whether it reads the answer out of the tool response. Evaluation applies the same rule to the same rendered
context (`opening_for`), through a thin OpenAI-compatible proxy in front of the served model
(trainer/proofs/search_proxy.py): the
proxy appends the opening to the prompt of `/v1/completions`, forwards it, and returns the opening plus the
continuation as the completion, so `searchrl eval` and `searchrl compare` run unchanged (their prompt, tool
parsing, search client, answer parsing, scoring and report), base and trained models alike.
"""

from __future__ import annotations

import json

ASSISTANT_HEADER = "<|im_start|>assistant\n"
TOOL_RESPONSE_END = "</tool_response>"
ANSWER_OPENING = "<answer>"
ANSWER_CLOSING = "</answer>"
# With `close_answer` (the run's `--close-answer`), the answer turn ends at the first newline or `<` the model writes
# and the environment closes the answer: what the model wrote before it is the answer.
ANSWER_STOPS = ("\n", "<")
CLOSE_ANSWER_KEY = "close_answer"  # its engine_kwargs.searchrl key (training) and proxy flag (eval)
# the search tool's schema name as the chat template renders it in the system turn (searchrl/chat_template.py)
_TOOLS_MARK = '"name": "search"'


def search_call_opening() -> str:
    """`<tool_call>\\n{"name": "search", "arguments": {"query_list": ["`: the CPU runs' scripted call up to its
    query (the same json.dumps formatting as trainer/cpu/scripted_agent_loop.py, which imports verl)."""
    marker = "QUERY_STARTS_HERE"
    call = (
        f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': {'query_list': [marker]}})}\n</tool_call>"
    )
    return call[: call.index(marker)]


SEARCH_OPENING = search_call_opening()


def closed_answer(continuation: str) -> str:
    """The answer turn's text after the opening when the environment closes it: the continuation cut at the first
    of ANSWER_STOPS, then ANSWER_CLOSING."""
    cut = min(
        (i for i in (continuation.find(stop) for stop in ANSWER_STOPS) if i >= 0), default=len(continuation)
    )
    return continuation[:cut] + ANSWER_CLOSING


def opening_for(prompt: str) -> str:
    """The opening the environment writes where the rendered `prompt` ends (module docstring); "" for none.

    A prompt that does not end with the assistant header is not a turn's start. After a tool response: the
    answer opening. The first assistant turn: the search opening when the prompt offers the search tool, else
    the answer opening. Any other turn (e.g. after a malformed call's feedback): none."""
    if not prompt.endswith(ASSISTANT_HEADER):
        return ""
    body = prompt[: -len(ASSISTANT_HEADER)]
    last_assistant = body.rfind(ASSISTANT_HEADER)
    if last_assistant >= 0:
        return ANSWER_OPENING if TOOL_RESPONSE_END in body[last_assistant:] else ""
    return SEARCH_OPENING if _TOOLS_MARK in body else ANSWER_OPENING


__all__ = [
    "ANSWER_CLOSING",
    "ANSWER_OPENING",
    "ANSWER_STOPS",
    "CLOSE_ANSWER_KEY",
    "SEARCH_OPENING",
    "closed_answer",
    "opening_for",
    "search_call_opening",
]
