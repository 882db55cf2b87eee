"""The prompt, the `search` tool schema, hermes tool-call parsing and observation formatting.

One module, used by data prep (trainer), the verl tool (trainer) and the agent loop (infer), so the model is
taught exactly the format that verl's hermes parser reads and that the reward scores:

    <tool_call>{"name": "search", "arguments": {"query_list": ["..."]}}</tool_call>   -> a search
    <answer> ... </answer>                                                            -> the final answer

The old verl search example told the model to write `<tool_call> query </tool_call>`, which the hermes parser
rejects ("Failed to decode tool call"), so a model trained on it never searched (../shared/DESIGN.md section 3).
Bump PROMPT_VERSION whenever the wording changes: it is recorded with every evaluation result.

The `search-r1` format is the one Search-R1's released checkpoints (`PeterJinGo/SearchR1-*`) were trained on, so
they can be evaluated against our service as they are: `<search> query </search>` actions, results spliced into
the same assistant turn as `<information>...</information>`, passages as `Doc i(Title: "T") text`. Wording and
rules follow PeterGriffinJin/Search-R1 at a14dc3a: the instruction text of `scripts/data_process/
qa_search_test_merge.py` (`make_prefix`, typo "as your want" included: the checkpoints read it), the action
regex, observation wrapper, invalid-action message and passage format of `search_r1/llm_agent/generation.py`
(`postprocess_predictions`, `execute_predictions`, `_passages2string`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROMPT_VERSION = "searchrl-v1"
# "+q": questions not ending in "?" get one, as Search-R1's make_prefix does (before: only those without ".!?")
SEARCH_R1_PROMPT_VERSION = "search-r1@a14dc3a+q"
TOOL_NAME = "search"

# Search failure kinds the model causes, not the service: a call whose arguments hold no usable query
# (`bad_arguments`), an empty Search-R1 `<search> </search>` (`empty_query`), a body the service refuses by its
# schema (`http_422`: a query over the length limit, too many queries; the pre-flight search already proved the
# client's own requests pass). Training does not count them against the service (trainer/plugins/reward.py) and
# evaluation reports them as model behaviour, never against a run's validity (infer/summary.py).
POLICY_FAILURES = frozenset({"bad_arguments", "empty_query", "http_422"})

SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Searches an encyclopedia for passages relevant to each query and returns the top results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "One or more search queries, each a short phrase or question.",
                }
            },
            "required": ["query_list"],
        },
    },
}

_SEARCH_INSTRUCTIONS = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call the search tool by "
    'writing <tool_call>{{"name": "search", "arguments": {{"query_list": ["your query"]}}}}</tool_call>, and it '
    "will return the top searched results between <tool_response> and </tool_response>. You can search as many "
    "times as you want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

_NO_SEARCH_INSTRUCTIONS = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. Then provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: {question}\n"
)

# Search-R1's instruction text, verbatim (see the module docstring for the source).
_SEARCH_R1_INSTRUCTIONS = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
SEARCH_R1_STOP = "</search>"  # generation stops after a search action, as Search-R1's rollout does
SEARCH_R1_INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
_SEARCH_R1_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def prompt_version(prompt_format: str = "searchrl") -> str:
    """The wording version recorded in every result's protocol."""
    return SEARCH_R1_PROMPT_VERSION if prompt_format == "search-r1" else PROMPT_VERSION


def build_user_prompt(question: str, *, search: bool = True, prompt_format: str = "searchrl") -> str:
    """The user turn for a question; `search=False` gives the no-search baseline's instructions."""
    question = question.strip()
    # Search-R1 (make_prefix) appends "?" to every question that does not end in one; ours spares "." and "!".
    keep = "?" if prompt_format == "search-r1" and search else "?.!"
    if question and question[-1] not in keep:
        question += "?"
    if not search:
        template = _NO_SEARCH_INSTRUCTIONS
    elif prompt_format == "search-r1":
        template = _SEARCH_R1_INSTRUCTIONS
    else:
        template = _SEARCH_INSTRUCTIONS
    return template.format(question=question)


def build_messages(
    question: str, *, search: bool = True, prompt_format: str = "searchrl"
) -> list[dict[str, str]]:
    """Chat messages for a question (the chat template adds the tool schema when tools are passed)."""
    return [
        {"role": "user", "content": build_user_prompt(question, search=search, prompt_format=prompt_format)}
    ]


def parse_search_r1_action(text: str) -> tuple[str | None, str]:
    """(`search` | `answer` | None, content) of the first action tag, as Search-R1's rollout reads a turn."""
    match = _SEARCH_R1_ACTION_RE.search(text)
    if not match:
        return None, ""
    return match.group(1), match.group(2).strip()


def cut_search_r1_turn(text: str) -> str:
    """A turn up to its first `</search>` (else first `</answer>`): what Search-R1 keeps of a generation."""
    if SEARCH_R1_STOP in text:
        return text.split(SEARCH_R1_STOP)[0] + SEARCH_R1_STOP
    if "</answer>" in text:
        return text.split("</answer>")[0] + "</answer>"
    return text


def format_search_r1_observation(contents: Sequence[str], *, max_chars: int | None = None) -> str:
    """Results the way Search-R1 models read them: `Doc i(Title: "T") text` lines inside <information>."""
    lines = []
    for i, c in enumerate(contents, start=1):
        title, _, text = c.partition("\n")  # the title keeps its quotes, as in Search-R1
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    body = "".join(lines).strip()
    if max_chars is not None and len(body) > max_chars:
        body = body[:max_chars].rstrip() + "..."
    return f"\n\n<information>{body}</information>\n\n"


@dataclass(frozen=True)
class ToolCall:
    """One parsed hermes tool call."""

    name: str
    # verl passes whatever JSON the model wrote (an object, a string, a list) to the tool, which answers
    # "bad arguments" for anything but an object; so do we (queries_from_arguments).
    arguments: Any = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn asked for: tool calls, plus one message per call that failed to parse."""

    calls: list[ToolCall]
    errors: list[str]
    content: str  # the text outside the tool-call tags


def parse_tool_calls(text: str) -> ParsedTurn:
    """Parse `<tool_call>{json}</tool_call>` spans the way verl's HermesToolParser does.

    verl keeps a span that is a JSON object with a string `name` and an `arguments` key, whatever the
    arguments' JSON type (a string holding JSON stays a string: the tool then answers "bad arguments"), and
    drops the rest ("Failed to decode tool call"). A dropped span becomes an error message instead of a call,
    so the caller can tell the model what was wrong instead of silently doing nothing.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for raw in _TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call is not valid JSON ({exc.msg}): {raw.strip()[:200]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
            errors.append(f'tool call needs {{"name": ..., "arguments": {{...}}}}: {raw.strip()[:200]}')
            continue
        calls.append(ToolCall(name=obj["name"], arguments=obj["arguments"]))
    content = _TOOL_CALL_RE.sub("", text).strip()
    return ParsedTurn(calls=calls, errors=errors, content=content)


def queries_from_arguments(arguments: Any) -> list[str]:
    """The non-empty queries of a `search` call; accepts `query_list` (schema) or a bare `query` string.

    Raises ValueError with a message meant for the model when no usable query is present, including when the
    arguments are not a JSON object at all (verl passes whatever `json.loads` made of them: a list, a string).
    """
    if not isinstance(arguments, Mapping):
        raise ValueError(
            f'arguments must be a JSON object like {{"query_list": ["..."]}}, got {type(arguments).__name__}'
        )
    raw: Any = arguments.get("query_list", arguments.get("query"))
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ValueError('search needs "query_list": a list of query strings')
    queries = [q.strip() for q in raw if isinstance(q, str) and q.strip()]
    if not queries:
        raise ValueError('search needs at least one non-empty string in "query_list"')
    return queries


def split_title(contents: str) -> tuple[str, str]:
    """Split Search-R1 `contents` ("\\"Title\\"\\ntext") into (title, text)."""
    first, _, rest = contents.partition("\n")
    return first.strip().strip('"'), rest.strip()


def format_passages(contents: Sequence[str], *, max_chars_per_doc: int | None = None) -> str:
    """One query's results the way Search-R1-trained models read them: `Doc i (Title: T) text` lines."""
    lines = []
    for i, c in enumerate(contents, start=1):
        title, text = split_title(c)
        if max_chars_per_doc is not None and len(text) > max_chars_per_doc:
            text = text[:max_chars_per_doc].rstrip() + "..."
        lines.append(f"Doc {i} (Title: {title}) {text}")
    return "\n".join(lines)


TRUNCATION_MARK = "..."  # ends a cut passage or observation
# Characters of "Doc i (Title: ...) " framing per passage, plus a per-query header, when sizing the observation
# budget in characters (verl truncates tool responses by characters, not tokens).
DOC_OVERHEAD_CHARS = 96


def observation_budget(topk: int, passage_max_chars: int) -> int:
    """The observation cap in characters: top-k passages of `passage_max_chars` plus their framing.

    Training (verl's max_tool_response_length, the tool's cap) and inference use this one number, so the model
    reads the same amount of text in both.
    """
    return topk * (passage_max_chars + DOC_OVERHEAD_CHARS) + DOC_OVERHEAD_CHARS


def format_observation(
    queries: Sequence[str],
    results: Sequence[Sequence[str]],
    *,
    max_chars_per_doc: int | None = None,
    max_chars: int | None = None,
) -> str:
    """One block per query (prefixed by the query when there are several), capped at `max_chars`."""
    if len(queries) == 1:
        text = format_passages(results[0], max_chars_per_doc=max_chars_per_doc)
    else:
        text = "\n\n".join(
            f"Query: {q}\n{format_passages(r, max_chars_per_doc=max_chars_per_doc)}"
            for q, r in zip(queries, results, strict=True)
        )
    if not text.strip():
        text = "search returned no results"
    if max_chars is not None and len(text) > max_chars:
        # The marker counts against the cap: verl truncates anything longer than max_tool_response_length again.
        text = text[: max(max_chars - len(TRUNCATION_MARK), 0)].rstrip() + TRUNCATION_MARK
    return text[:max_chars] if max_chars is not None else text


__all__ = [
    "TRUNCATION_MARK",
    "DOC_OVERHEAD_CHARS",
    "POLICY_FAILURES",
    "PROMPT_VERSION",
    "SEARCH_R1_INVALID",
    "SEARCH_R1_PROMPT_VERSION",
    "SEARCH_R1_STOP",
    "SEARCH_TOOL_SCHEMA",
    "TOOL_NAME",
    "ParsedTurn",
    "ToolCall",
    "build_messages",
    "build_user_prompt",
    "cut_search_r1_turn",
    "format_observation",
    "format_search_r1_observation",
    "format_passages",
    "observation_budget",
    "parse_search_r1_action",
    "parse_tool_calls",
    "prompt_version",
    "queries_from_arguments",
    "split_title",
]
