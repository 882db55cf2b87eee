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
answer first, not to remember the closing tag. With `answer_tokens` (the run's `--answer-tokens`) the answer turn
may write at most that many tokens (run 11's answers held the title inside the passage's first sentence). Likewise (`close_query`, the run's `--close-query`) the query turn
ends at the first token that closes the query's JSON string (a `"` followed by nothing or by the start of the call's
closing, e.g. `"`, `"]`, `."`) and the environment writes the rest of the call (`query_closing`): the policy then
decides only the query, and every query it closes runs (run 9 learned to copy the question as its query, then 46 of
60 held-out calls ran to the turn cap and the rest carried one brace too many, so no search ran).

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
import re
from collections.abc import Callable
from typing import Any

ASSISTANT_HEADER = "<|im_start|>assistant\n"
TOOL_RESPONSE_END = "</tool_response>"
ANSWER_OPENING = "<answer>"
ANSWER_CLOSING = "</answer>"
# With `close_answer` (the run's `--close-answer`), the answer turn ends at the first newline or `<` the model writes
# and the environment closes the answer: what the model wrote before it is the answer.
ANSWER_STOPS = ("\n", "<")
CLOSE_ANSWER_KEY = "close_answer"  # its engine_kwargs.searchrl key (training) and proxy flag (eval)
CLOSE_QUERY_KEY = "close_query"  # the same for `close_query`
# With `answer_tokens` (the run's `--answer-tokens`), the answer turn may write at most that many new tokens, the
# query turn still the turn cap: a cut answer is closed as a broken line is (`closed_answer`)
# its engine_kwargs.searchrl key (training); the eval proxy takes --answer-tokens
ANSWER_TOKENS_KEY = "answer_max_tokens"
# the search tool's schema name as the chat template renders it in the system turn (searchrl/chat_template.py)
_TOOLS_MARK = '"name": "search"'


def _search_call_parts() -> tuple[str, str]:
    """A search call's text before and after its one query, `json.dumps`-formatted as the CPU runs' scripted call
    (trainer/cpu/scripted_agent_loop.py, which imports verl)."""
    marker = "QUERY_STARTS_HERE"
    call = (
        f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': {'query_list': [marker]}})}\n</tool_call>"
    )
    before, after = call.split(marker)
    return before, after


def search_call_opening() -> str:
    """`<tool_call>\\n{"name": "search", "arguments": {"query_list": ["`: the CPU runs' scripted call up to its
    query."""
    return _search_call_parts()[0]


SEARCH_OPENING = search_call_opening()
# what follows the query in the whole call: `"]}}\n</tool_call>`
CALL_CLOSING = _search_call_parts()[1]
_QUOTE = re.compile(r'(?<!\\)"')  # a quote that ends a JSON string (one after a backslash is escaped)


def query_closing(continuation: str) -> str | None:
    """What the environment appends to a query turn under `close_query`: the rest of CALL_CLOSING after the
    continuation's text from its first `"`; None when the continuation has no `"` (the query was never closed) or
    what follows the quote is not the start of CALL_CLOSING (a second query, a stray character: the model's call,
    left as it wrote it). An escaped `\\"` is part of the query, not its end."""
    found = _QUOTE.search(continuation)
    if found is None:
        return None
    tail = continuation[found.start() :]
    return CALL_CLOSING[len(tail) :] if CALL_CLOSING.startswith(tail) else None


def written_query(response: str) -> str | None:
    """The query written after the first search-call opening, up to its first `"` (or the text's end) whether or
    not the call then parsed; None when the episode has no opening (search off) or the query is empty. What the
    reward's query terms (search_reward.py) and the report's query measure (written_queries.py) read."""
    start = response.find(SEARCH_OPENING)
    if start < 0:
        return None
    query = response[start + len(SEARCH_OPENING) :].split('"', 1)[0].strip()
    return query or None


def ends_query(token_text: str) -> bool:
    """Whether a token ends the query turn under `close_query`: it holds a `"` and what follows its first `"` is
    the start of CALL_CLOSING (`"`, `"]`, `."`, `"]}}`); a token like `",` does not (the model goes on)."""
    return query_closing(token_text) is not None


_STOP_IDS: dict[tuple[int, str], list[int]] = {}


def _ids_where(tokenizer: Any, kind: str, test: Callable[[str], bool]) -> list[int]:
    key = (id(tokenizer), kind)
    if key not in _STOP_IDS:
        _STOP_IDS[key] = [i for i in range(len(tokenizer)) if test(tokenizer.decode([i]))]
    return _STOP_IDS[key]


def answer_stop_ids(tokenizer: Any) -> list[int]:
    """Every token id whose text holds one of ANSWER_STOPS: the token-level form of the eval proxy's stop strings
    (a token like `.\\n` stops the turn where the string `\\n` would)."""
    return _ids_where(tokenizer, "answer", lambda text: any(stop in text for stop in ANSWER_STOPS))


def query_stop_ids(tokenizer: Any) -> list[int]:
    """Every token id that `ends_query`: the query turn's stop tokens, in training and in the eval proxy alike
    (token ids, not stop strings, so both cut the turn after the same token)."""
    return _ids_where(tokenizer, "query", ends_query)


def closed_answer(continuation: str) -> str:
    """The answer turn's text after the opening when the environment closes it: the continuation cut at the first
    of ANSWER_STOPS, then ANSWER_CLOSING."""
    cut = min(
        (i for i in (continuation.find(stop) for stop in ANSWER_STOPS) if i >= 0), default=len(continuation)
    )
    return continuation[:cut] + ANSWER_CLOSING


def answer_budget(params: dict[str, Any], answer_tokens: int | None) -> dict[str, Any]:
    """`params` (sampling parameters, a completion request's body) with `max_tokens` at most `answer_tokens` for an
    answer turn; unchanged without a cap. Training's agent loop and the eval proxy both apply it, so an answer is cut
    after the same number of tokens in both."""
    if not answer_tokens:
        return params
    return {**params, "max_tokens": min(int(params.get("max_tokens") or answer_tokens), answer_tokens)}


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
    "ANSWER_TOKENS_KEY",
    "answer_budget",
    "answer_stop_ids",
    "query_stop_ids",
    "CALL_CLOSING",
    "CLOSE_ANSWER_KEY",
    "CLOSE_QUERY_KEY",
    "SEARCH_OPENING",
    "closed_answer",
    "ends_query",
    "opening_for",
    "query_closing",
    "written_query",
    "search_call_opening",
]
