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
    ANSWER_STOPS,
    CLOSE_ANSWER_KEY,
    SEARCH_OPENING,
)

AGENT_NAME = "searchrl_search_openings_agent"


class _OpenedParser:
    """verl's tool parser, reading `opening` ids in front of the ids it is given (module docstring)."""

    def __init__(self, inner: Any, opening: list[int]) -> None:
        self._inner = inner
        self._opening = opening

    async def extract_tool_calls(self, ids: list[int], *args: Any, **kwargs: Any) -> Any:
        return await self._inner.extract_tool_calls(self._opening + list(ids), *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_STOP_IDS: dict[int, list[int]] = {}


def answer_stop_ids(tokenizer: Any) -> list[int]:
    """Every token id whose text holds one of ANSWER_STOPS: the token-level form of the eval proxy's stop strings
    (a token like `.\\n` stops the turn where the string `\\n` would)."""
    key = id(tokenizer)
    if key not in _STOP_IDS:
        _STOP_IDS[key] = [
            i for i in range(len(tokenizer)) if any(stop in tokenizer.decode([i]) for stop in ANSWER_STOPS)
        ]
    return _STOP_IDS[key]


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
        closing = opening == ANSWER_OPENING and bool(
            searchrl_engine_kwargs(self.rollout_config).get(CLOSE_ANSWER_KEY)
        )
        if closing:
            stops = set(sampling_params.get("stop_token_ids") or []) | set(answer_stop_ids(self.tokenizer))
            sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
        parser = self.tool_parser
        self.tool_parser = _OpenedParser(parser, ids)
        try:
            state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        finally:
            self.tool_parser = parser
        if closing and ANSWER_CLOSING not in self.tokenizer.decode(agent_data.response_ids):
            # the environment closes the answer (search_env.closed_answer); loss mask 0
            closing_ids = self.tokenizer.encode(ANSWER_CLOSING, add_special_tokens=False)
            if await self._merge_as_environment(agent_data, closing_ids):
                return AgentState.TERMINATED
        return state


__all__ = ["AGENT_NAME", "SearchOpeningsAgentLoop", "answer_stop_ids", "opening_of"]
