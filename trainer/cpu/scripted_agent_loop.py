"""The CPU runs' agent loop: our agent loop whose scripted first turn (or opening) is *environment*, loss mask 0.

A random tiny model almost never writes a well-formed `<tool_call>`, so the CPU runs (`make train-cpu`,
`make learn-cpu`) script the first assistant turn: the call `search(query_list=[<the question>])`. Before this
loop, the rollout server generated that turn and verl merged it as assistant tokens with loss mask 1
(utils/tokenizer/continuous_token.py:399-400 via tool_agent_loop.py:274-282), so the policy-gradient, entropy
and KL terms trained the model on text it never chose (DESIGN.md 3c). Here the loop itself writes the turn, with
loss mask 0 like any observation: the policy is trained only on what it sampled, and the rollout/actor
consistency metrics (computed over mask-1 tokens) see only sampled tokens. `make learn-cpu-real --stage query`
scripts an opening instead (`scripted_opening`): the start of the call, which the model continues.

The switches are the CPU runs' `engine_kwargs.searchrl.scripted_first_turn` and `.scripted_opening`
(trainer/plugins/engine_kwargs.py). The trajectory's `extra_fields` count the calls the loop scripted; the sampler
logs them as `search/scripted_calls`, and `search/model_calls` (executed calls less scripted ones) as the calls the
model wrote itself (trainer/plugins/metrics.py). Everything else, the record of what the server generated and the
turn budget, is the parent's (trainer/plugins/agent_loop.py), so the CPU runs check the same mask invariant as a
GPU run. With the `observations_in_loss` sabotage (trainer/cpu/sabotage.py) the loop puts every tool-response
token into the loss, so the CPU runs can prove the mask checks stop it.

Registered as `searchrl_scripted_tool_agent` when this module is imported: trainer/cpu/plugin.py imports it in
every Ray process of a CPU run, and the CPU runs' settings select it (trainer/proofs/train_cpu.py
`cpu_settings`). A GPU run never imports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState

from searchrl.trainer.cpu import sabotage
from searchrl.trainer.plugins.agent_loop import SearchToolAgentLoop
from searchrl.trainer.plugins.engine_kwargs import searchrl_engine_kwargs
from searchrl.trainer.plugins.metrics import SCRIPTED_CALLS

SCRIPTED_AGENT_NAME = "searchrl_scripted_tool_agent"
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


def search_call_opening() -> str:
    """The scripted call up to where its query starts: `<tool_call>\n{"name": "search", "arguments":
    {"query_list": ["` (the same schema and formatting as `scripted_tool_call`)."""
    marker = "QUERY_STARTS_HERE"
    call = scripted_tool_call(marker)
    return call[: call.index(marker)]


# Openings the loop can script, by the name the override gives (the text itself would need Hydra quoting)
OPENINGS = {"search_call": search_call_opening}


def scripted_opening(rollout_config: Any) -> str:
    """The text `actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_opening` names (a key of OPENINGS): the
    loop writes it, as environment, where the model's first turn opens, and the model continues it (`make
    learn-cpu-real --stage query`); "" for none."""
    name = str(searchrl_engine_kwargs(rollout_config).get("scripted_opening") or "")
    if not name:
        return ""
    if name not in OPENINGS:
        raise ValueError(f"scripted_opening {name!r}: not one of {sorted(OPENINGS)}")
    return OPENINGS[name]()


@register(SCRIPTED_AGENT_NAME)
class ScriptedToolAgentLoop(SearchToolAgentLoop):
    """SearchToolAgentLoop whose scripted first turn or opening (when enabled) is environment (module docstring)."""

    scripts_turns: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripted_first_turn = bool(
            searchrl_engine_kwargs(self.rollout_config).get("scripted_first_turn", False)
        )
        self.scripted_opening = scripted_opening(self.rollout_config)
        self._opened = False

    async def run(self, sampling_params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self._opened = False
        return await super().run(sampling_params, *args, **kwargs)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        """The scripted turn or opening before the model's first turn; the model's turns are the parent's (so the
        record holds only what the server generated)."""
        if self.scripted_first_turn and agent_data.assistant_turns == 0:
            state = await self._scripted_turn(agent_data)
            if state is not None:
                return state
        if self.scripted_opening and agent_data.assistant_turns == 0 and not self._opened:
            self._opened = True
            if await self._scripted_opening(agent_data):
                return AgentState.TERMINATED
        return await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)

    async def _scripted_turn(self, agent_data: AgentData) -> AgentState | None:
        """Append the scripted call with loss mask 0; None when the prompt states no question to search."""
        users = [m for m in agent_data.messages if m.get("role") == "user"]
        question = question_of(_content(users[-1])) if users else None
        if question is None:
            return None
        ids = self.tokenizer.encode(scripted_tool_call(question), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        agent_data.assistant_turns += 1
        agent_data.response_ids = ids
        if await self._merge_as_environment(agent_data, ids):
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
        return await self._merge_as_environment(agent_data, ids)

    async def _merge_as_environment(self, agent_data: AgentData, ids: list[int]) -> bool:
        """verl's assistant-token merge of `ids`, with loss mask 0 on what it appended; True when the response
        budget is full."""
        before = len(agent_data.response_mask)
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
        return bool(len(agent_data.response_mask) >= self.response_length)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        before = len(agent_data.response_mask)
        state = await super()._handle_processing_tools_state(agent_data)
        if sabotage.active(sabotage.OBSERVATIONS_IN_LOSS):
            grown = len(agent_data.response_mask) - before
            agent_data.response_mask = agent_data.response_mask[:before] + [1] * grown
        return state


__all__ = [
    "OPENINGS",
    "SCRIPTED_AGENT_NAME",
    "ScriptedToolAgentLoop",
    "question_of",
    "scripted_opening",
    "scripted_tool_call",
    "search_call_opening",
]
