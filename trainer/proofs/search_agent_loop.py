"""`make learn-search`'s agent loop: the CPU runs' loop plus the declared environment's two openings.

trainer/proofs/search_env.py says what the environment writes and why; this loop writes it in training, with loss
mask 0 (trainer/cpu/scripted_agent_loop.py `_merge_as_environment`), so the policy is trained only on the query
and the answer it sampled. The search opening starts the call the model finishes: verl's hermes parser reads the
tool call from the turn's generated ids, so while the model's turn after the opening is parsed, the loop hands the
parser the opening's ids in front of the generated ones (`_OpenedParser`), and the call runs through verl's
tool, our SearchTool, against the run's service, as a model-written call would.

Registered as `searchrl_search_openings_agent` when imported: `make learn-search` adds this module to the plugin
list every Ray process imports (trainer/proofs/learn_search.py) and selects it as the run's agent loop.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState

from searchrl.trainer.cpu.scripted_agent_loop import ScriptedToolAgentLoop
from searchrl.trainer.plugins.engine_kwargs import searchrl_engine_kwargs
from searchrl.trainer.proofs.search_env import (
    ANSWER_CLOSING,
    ANSWER_OPENING,
    ANSWER_TOKENS_KEY,
    CLOSE_ANSWER_KEY,
    CLOSE_QUERY_KEY,
    SEARCH_OPENING,
    answer_budget,
    answer_stop_ids,
    query_closing,
    query_stop_ids,
)

AGENT_NAME = "searchrl_search_openings_agent"


class _OpenedParser:
    """verl's tool parser, reading `opening` ids in front of the ids it is given (module docstring). With
    `tokenizer` (the environment closes the query, search_env.query_closing), it reads the environment's closing of
    the call behind them too, and keeps its ids in `closing` for the loop to append."""

    def __init__(self, inner: Any, opening: list[int], tokenizer: Any = None) -> None:
        self._inner = inner
        self._opening = opening
        self._tokenizer = tokenizer
        self.closing: list[int] = []

    async def extract_tool_calls(self, ids: list[int], *args: Any, **kwargs: Any) -> Any:
        if self._tokenizer is not None:
            closing = query_closing(self._tokenizer.decode(list(ids)))
            self.closing = self._tokenizer.encode(closing, add_special_tokens=False) if closing else []
        return await self._inner.extract_tool_calls(self._opening + list(ids) + self.closing, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def opening_of(turns: int, last_role: str | None, searching: bool = True) -> str:
    """The environment's opening for a turn (search_env.opening_for, on messages instead of rendered text)."""
    if turns == 0:
        return SEARCH_OPENING if searching else ANSWER_OPENING
    return ANSWER_OPENING if last_role == "tool" else ""


@register(AGENT_NAME)
class SearchOpeningsAgentLoop(ScriptedToolAgentLoop):
    """ScriptedToolAgentLoop (its own scripting off) that opens each turn as the environment says."""

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        last = agent_data.messages[-1].get("role") if agent_data.messages else None
        opening = opening_of(agent_data.assistant_turns, last)
        if not opening:
            return await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        ids = self.tokenizer.encode(opening, add_special_tokens=False)
        if await self._merge_as_environment(agent_data, ids):
            return AgentState.TERMINATED
        declared = searchrl_engine_kwargs(self.rollout_config)
        closing = opening == ANSWER_OPENING and bool(declared.get(CLOSE_ANSWER_KEY))
        closing_query = opening == SEARCH_OPENING and bool(declared.get(CLOSE_QUERY_KEY))
        stop_ids = (
            answer_stop_ids(self.tokenizer)
            if closing
            else query_stop_ids(self.tokenizer)
            if closing_query
            else []
        )
        if opening == ANSWER_OPENING:
            sampling_params = answer_budget(sampling_params, declared.get(ANSWER_TOKENS_KEY))
        if stop_ids:
            stops = set(sampling_params.get("stop_token_ids") or []) | set(stop_ids)
            sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
        parser = self.tool_parser
        opened = _OpenedParser(parser, ids, self.tokenizer if closing_query else None)
        self.tool_parser = opened
        try:
            state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        finally:
            self.tool_parser = parser
        if state == AgentState.PROCESSING_TOOLS and opened.closing:
            # the environment writes the rest of the call (search_env.query_closing) before the tool's response;
            # loss mask 0
            if await self._merge_as_environment(agent_data, opened.closing):
                return AgentState.TERMINATED
        if closing and ANSWER_CLOSING not in self.tokenizer.decode(agent_data.response_ids):
            # the environment closes the answer (search_env.closed_answer); loss mask 0
            closing_ids = self.tokenizer.encode(ANSWER_CLOSING, add_special_tokens=False)
            if await self._merge_as_environment(agent_data, closing_ids):
                return AgentState.TERMINATED
        return state


__all__ = ["AGENT_NAME", "SearchOpeningsAgentLoop", "opening_of"]
