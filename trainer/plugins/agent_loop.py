"""verl's ToolAgentLoop with the CPU run's scripted first turn as *environment*, and a count of model-written calls.

A random tiny model almost never writes a well-formed `<tool_call>`, so the CPU runs (`make train-cpu`,
`make learn-cpu`) script the first assistant turn: the call `search(query_list=[<the question>])`. Before this
loop, the rollout server generated that turn and verl merged it as assistant tokens with loss mask 1
(utils/tokenizer/continuous_token.py:399-400 via tool_agent_loop.py:274-282), so the policy-gradient, entropy
and KL terms trained the model on text it never chose (DESIGN.md 3c). Here the loop itself writes the turn, with
loss mask 0 like any observation: the policy is trained only on what it sampled, and the rollout/actor
consistency metrics (computed over mask-1 tokens) see only sampled tokens. With `turn_max_tokens` set, every
request carries that `max_tokens` (verl sets none).

The trajectory's `extra_fields` count the calls the loop scripted; the sampler logs them as
`search/scripted_calls`, and `search/model_calls` (executed calls less scripted ones) as the calls the model
wrote itself (trainer/plugins/metrics.py).

**What the server generated, recorded.** Every turn that comes back from the server's `generate()` is recorded
as a response-relative token range [start, end): where verl's `merge_assistant_tokens` appended it (verl's
MergeResult says how many tokens it appended), cut where a later context merge dropped prefix tokens (GLM,
Gemma 4 and DeepSeek builders trim the turn's tail) and where verl truncates the response at response_length.
The ranges (trainer/plugins/generated_spans.py `SPANS`) let the sampler check that loss mask 1 falls exactly on them;
the last one's text (`LAST_TURN`, decoded as verl's reward manager decodes) and the number of tool turns merged
into the response (`TOOL_RESPONSES`) reach the reward's `extra_info` (verl's reward managers merge the
trajectory's extra_fields into it), so a reward can score the model's own last turn without parsing the text.

Registered as `searchrl_tool_agent` when this module is imported. Every run selects it (the rows' agent_name and
`rollout.agent.default_agent_loop`, TrainSettings.agent_loop) and imports it in every Ray process: the CPU runs
through trainer/cpu/plugin.py, the GPU runs through `VERL_USE_EXTERNAL_MODULES` (trainer/overrides.py), so the
mask invariant holds whatever the engine and chat template. A GPU run never scripts a turn (the switch is the CPU
runs' `engine_kwargs.hf.scripted_first_turn`): there it is verl's ToolAgentLoop plus the record.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase
from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from searchrl.trainer.cpu import sabotage
from searchrl.trainer.plugins.generated_spans import (
    LAST_TURN,
    SPANS,
    TOOL_RESPONSES,
    Span,
    clip_spans,
    format_spans,
)
from searchrl.trainer.plugins.metrics import SCRIPTED_CALLS

log = logging.getLogger(__name__)

AGENT_NAME = "searchrl_tool_agent"
_QUESTION = re.compile(r"Question:\s*(.+?)\s*(?:\n|$)")


def scripted_tool_call(question: str) -> str:
    """The scripted first turn: one hermes tool call searching the question (trainer/plugins/tool.py's schema)."""
    arguments = {"query_list": [question]}
    return f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': arguments})}\n</tool_call>"


def question_of(text: str) -> str | None:
    """The question a user turn states (searchrl/prompt.py ends its prompt with `Question: ...`)."""
    found = _QUESTION.findall(text)
    return found[-1] if found else None


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""


def _scripting_enabled(rollout_config: Any) -> bool:
    """`actor_rollout_ref.rollout.engine_kwargs.hf.scripted_first_turn` (set by the CPU runs only)."""
    from searchrl.trainer.cpu.hf_rollout import hf_engine_kwargs

    return bool(hf_engine_kwargs(rollout_config).get("scripted_first_turn", False))


def search_call_opening() -> str:
    """The scripted call up to where its query starts: `<tool_call>\n{"name": "search", "arguments":
    {"query_list": ["` (the same schema and formatting as `scripted_tool_call`)."""
    marker = "QUERY_STARTS_HERE"
    call = scripted_tool_call(marker)
    return call[: call.index(marker)]


# Openings the loop can script, by the name the override gives (the text itself would need Hydra quoting)
OPENINGS = {"search_call": search_call_opening}


def scripted_opening(rollout_config: Any) -> str:
    """The text `actor_rollout_ref.rollout.engine_kwargs.hf.scripted_opening` names (a key of OPENINGS): the loop
    writes it, as environment, where the model's first turn opens, and the model continues it (`make
    learn-cpu-real --stage query`); "" for none."""
    from searchrl.trainer.cpu.hf_rollout import hf_engine_kwargs

    name = str(hf_engine_kwargs(rollout_config).get("scripted_opening") or "")
    if not name:
        return ""
    if name not in OPENINGS:
        raise ValueError(f"scripted_opening {name!r}: not one of {sorted(OPENINGS)}")
    return OPENINGS[name]()


def turn_max_tokens(rollout_config: Any) -> int | None:
    """`actor_rollout_ref.rollout.engine_kwargs.hf.turn_max_tokens`: new tokens one model turn may generate.

    verl's agent loop passes the server no `max_tokens`, so a turn may run to the whole response budget (a
    135M model rambles there: issue 39 item 10). The loop puts this cap into every request's sampling params,
    where the hf server (trainer/cpu/hf_rollout.py `turn_budget`) and verl's vLLM and sglang servers read it."""
    from searchrl.trainer.cpu.hf_rollout import hf_engine_kwargs

    value = hf_engine_kwargs(rollout_config).get("turn_max_tokens")
    if value is None:
        return None
    if int(value) < 1:
        raise ValueError(f"engine_kwargs.hf.turn_max_tokens={value!r}: must be at least 1")
    return int(value)


class _LastOutput:
    """The server client, remembering the last TokenOutput (one agent loop instance runs one trajectory)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last: Any = None

    async def generate(self, **kwargs: Any) -> Any:
        self.last = await self.inner.generate(**kwargs)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@register(AGENT_NAME)
class SearchToolAgentLoop(ToolAgentLoop):
    """ToolAgentLoop whose scripted first turn (when enabled) is environment, not policy (module docstring)."""

    # verl annotates `tokenizer` as AutoTokenizer, the factory class; it holds the tokenizer the factory returned
    tokenizer: PreTrainedTokenizerBase  # type: ignore[assignment]
    # wrapped in __init__; verl's code calls the wrapper as it would its LLMServerClient (every name forwards)
    server_manager: _LastOutput  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripted_first_turn = _scripting_enabled(self.rollout_config)
        self.turn_max_tokens = turn_max_tokens(self.rollout_config)
        self.scripted_opening = scripted_opening(self.rollout_config)
        self.server_manager = _LastOutput(self.server_manager)
        self._generated: list[Span] = []  # one instance runs one trajectory (verl instantiates one per run)
        self._tool_turns = 0
        self._assistant_merge: Span | None = None
        self._context_merge: Any = None
        self._opened = False

    async def run(self, sampling_params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """verl's run with the per-turn token budget in every request (verl sets no max_tokens), plus the record of
        what the server generated in the trajectory's extra_fields."""
        if self.turn_max_tokens is not None:
            sampling_params = {**sampling_params, "max_tokens": self.turn_max_tokens}
        self._generated, self._tool_turns, self._opened = [], 0, False
        output = await super().run(sampling_params, *args, **kwargs)
        spans = clip_spans(self._generated, len(output.response_ids))
        last = output.response_ids[spans[-1][0] : spans[-1][1]] if spans else []
        output.extra_fields[SPANS] = format_spans(spans)
        output.extra_fields[LAST_TURN] = self.tokenizer.decode(last, skip_special_tokens=True) if last else ""
        output.extra_fields[TOOL_RESPONSES] = self._tool_turns
        return output

    async def ct_merge_assistant_token(self, *args: Any, **kwargs: Any) -> Any:
        result = await super().ct_merge_assistant_token(*args, **kwargs)
        merge_result, response_mask, _ = result
        self._assistant_merge = (len(response_mask) - merge_result.appended_token_count, len(response_mask))
        return result

    async def ct_merge_context_msg(self, *args: Any, **kwargs: Any) -> Any:
        result = await super().ct_merge_context_msg(*args, **kwargs)
        self._context_merge = result[0]
        return result

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        if self.scripted_first_turn and agent_data.assistant_turns == 0:
            state = await self._scripted_turn(agent_data)
            if state is not None:
                return state
        if self.scripted_opening and agent_data.assistant_turns == 0 and not self._opened:
            self._opened = True
            if await self._scripted_opening(agent_data):
                return AgentState.TERMINATED
        self._assistant_merge = None
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        if self._assistant_merge is not None:  # verl keeps the merge whatever state comes next
            self._generated.append(self._assistant_merge)
        # verl copies the server's extra_fields (global_steps, min/max_global_steps, which the trainer's step
        # metrics read) only into an empty dict; after a scripted call the search tool's counters are there first
        last = self.server_manager.last
        for key, value in (getattr(last, "extra_fields", None) or {}).items():
            agent_data.extra_fields.setdefault(key, value)
        return state

    async def _scripted_turn(self, agent_data: AgentData) -> AgentState | None:
        """Append the scripted call with loss mask 0; None when the prompt states no question to search."""
        users = [m for m in agent_data.messages if m.get("role") == "user"]
        question = question_of(_content(users[-1])) if users else None
        if question is None:
            return None
        ids = self.tokenizer.encode(scripted_tool_call(question), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        before = len(agent_data.response_mask)
        agent_data.assistant_turns += 1
        agent_data.response_ids = ids
        merge_result, response_mask, response_logprobs = await self.ct_merge_assistant_token(
            agent_data.prompt_ids,
            ids,
            agent_data.response_mask,
            agent_data.response_logprobs,
            assistant_logprobs=[0.0] * len(ids),  # never read: mask 0 keeps them out of every metric and loss
        )
        agent_data.prompt_ids = merge_result.token_ids
        agent_data.response_mask = response_mask[:before] + [0] * (len(response_mask) - before)
        if response_logprobs is not None:
            agent_data.response_logprobs = response_logprobs
        if len(agent_data.response_mask) >= self.response_length:
            return AgentState.TERMINATED
        tools = [tool.tool_schema for tool in getattr(agent_data, "_active_tools", self.tools).values()]
        content, agent_data.tool_calls = await self.tool_parser.extract_tool_calls(ids, tools)
        agent_data.messages.append(self._build_assistant_message(content, agent_data))
        if not agent_data.tool_calls:
            raise RuntimeError(
                f"the scripted first turn did not parse as a tool call: {self.tokenizer.decode(ids)!r}"
            )
        scripted = len(agent_data.tool_calls[: self.max_parallel_calls])
        agent_data.extra_fields[SCRIPTED_CALLS] = (
            int(agent_data.extra_fields.get(SCRIPTED_CALLS, 0)) + scripted
        )
        return AgentState.PROCESSING_TOOLS

    async def _scripted_opening(self, agent_data: AgentData) -> bool:
        """Append the scripted opening of the first turn with loss mask 0 (the model continues it); True when it
        fills the response budget."""
        ids = self.tokenizer.encode(self.scripted_opening, add_special_tokens=False)
        before = len(agent_data.response_mask)
        merge_result, response_mask, response_logprobs = await self.ct_merge_assistant_token(
            agent_data.prompt_ids,
            ids,
            agent_data.response_mask,
            agent_data.response_logprobs,
            assistant_logprobs=[0.0] * len(ids),  # never read: mask 0
        )
        agent_data.prompt_ids = merge_result.token_ids
        agent_data.response_mask = response_mask[:before] + [0] * (len(response_mask) - before)
        if response_logprobs is not None:
            agent_data.response_logprobs = response_logprobs
        return bool(len(agent_data.response_mask) >= self.response_length)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        before = len(agent_data.response_mask)
        self._context_merge = None
        state = await super()._handle_processing_tools_state(agent_data)
        merge = self._context_merge
        # verl drops the merge when the tool response would overrun response_length; kept, it is a tool turn
        if merge is not None and agent_data.prompt_ids is merge.token_ids:
            self._tool_turns += 1
            if merge.removed_prefix_token_count:
                self._generated = clip_spans(self._generated, before - merge.removed_prefix_token_count)
        if sabotage.active(sabotage.OBSERVATIONS_IN_LOSS):
            grown = len(agent_data.response_mask) - before
            agent_data.response_mask = agent_data.response_mask[:before] + [1] * grown
        return state


__all__ = [
    "AGENT_NAME",
    "OPENINGS",
    "SearchToolAgentLoop",
    "question_of",
    "scripted_opening",
    "scripted_tool_call",
    "search_call_opening",
    "turn_max_tokens",
]
