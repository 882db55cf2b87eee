"""verl's ToolAgentLoop plus a per-turn token budget and the record of what the rollout server generated.

Every run's agent loop: registered as `searchrl_tool_agent` when this module is imported, selected by the rows'
agent_name and `rollout.agent.default_agent_loop` (TrainSettings.agent_loop) and imported in every Ray process
(the GPU runs through `VERL_USE_EXTERNAL_MODULES`, trainer/overrides.py), so the mask invariant holds whatever the
engine and chat template. With `turn_max_tokens` set (trainer/plugins/engine_kwargs.py), every request carries
that `max_tokens` (verl sets none).

**What the server generated, recorded.** Every turn that comes back from the server's `generate()` is recorded
as a response-relative token range [start, end): where verl's `merge_assistant_tokens` appended it (verl's
MergeResult says how many tokens it appended), cut where a later context merge dropped prefix tokens (GLM,
Gemma 4 and DeepSeek builders trim the turn's tail) and where verl truncates the response at response_length.
The ranges (trainer/plugins/generated_spans.py `SPANS`) let the sampler check that loss mask 1 falls exactly on them;
the last one's text (`LAST_TURN`, decoded as verl's reward manager decodes) and the number of tool turns merged
into the response (`TOOL_RESPONSES`) reach the reward's `extra_info` (verl's reward managers merge the
trajectory's extra_fields into it), so a reward can score the model's own last turn without parsing the text.

**The CPU runs' scripted turns are a subclass.** A random tiny model almost never writes a well-formed
`<tool_call>`, so the CPU runs script the first assistant turn as environment (loss mask 0): that is
trainer/cpu/scripted_agent_loop.py, registered under its own name, which only the CPU runs select and import. This
loop scripts nothing; it refuses the scripting keys of `engine_kwargs.searchrl` rather than silently ignore them,
so a CPU run that selected it by mistake stops at once. The `search/scripted_calls` metric
(trainer/plugins/metrics.py) counts what the subclass scripted; on a GPU run it is 0 and `search/model_calls` is every executed call.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase
from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from searchrl.trainer.plugins.engine_kwargs import SEARCHRL_BLOCK, searchrl_engine_kwargs
from searchrl.trainer.plugins.generated_spans import (
    LAST_TURN,
    SPANS,
    TOOL_RESPONSES,
    Span,
    clip_spans,
    format_spans,
)

log = logging.getLogger(__name__)

AGENT_NAME = "searchrl_tool_agent"
# `engine_kwargs.searchrl` keys that ask for scripted turns: only the CPU runs' subclass
# (trainer/cpu/scripted_agent_loop.py) reads them, so this loop refuses them instead of running unscripted
SCRIPTING_KEYS = ("scripted_first_turn", "scripted_opening")


def turn_max_tokens(rollout_config: Any) -> int | None:
    """`actor_rollout_ref.rollout.engine_kwargs.searchrl.turn_max_tokens`: new tokens one model turn may generate.

    verl's agent loop passes the server no `max_tokens`, so a turn may run to the whole response budget (a
    135M model rambles there: issue 39 item 10). The loop puts this cap into every request's sampling params,
    where verl's vLLM and sglang servers (and the CPU runs' engine) read it."""
    value = searchrl_engine_kwargs(rollout_config).get("turn_max_tokens")
    if value is None:
        return None
    if int(value) < 1:
        raise ValueError(f"engine_kwargs.{SEARCHRL_BLOCK}.turn_max_tokens={value!r}: must be at least 1")
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
    """ToolAgentLoop with the per-turn token budget and the record of generated spans (module docstring)."""

    # verl annotates `tokenizer` as AutoTokenizer, the factory class; it holds the tokenizer the factory returned
    tokenizer: PreTrainedTokenizerBase  # type: ignore[assignment]
    # wrapped in __init__; verl's code calls the wrapper as it would its LLMServerClient (every name forwards)
    server_manager: _LastOutput  # type: ignore[assignment]
    # whether this class writes the scripted turns SCRIPTING_KEYS ask for (the CPU runs' subclass does)
    scripts_turns: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        asked = [key for key in SCRIPTING_KEYS if searchrl_engine_kwargs(self.rollout_config).get(key)]
        if asked and not self.scripts_turns:
            raise ValueError(
                f"engine_kwargs.{SEARCHRL_BLOCK}.{asked[0]} is set, but agent loop {AGENT_NAME} scripts no turn: "
                "a CPU run selects the scripted loop (TrainSettings.agent_loop, trainer/cpu/scripted_agent_loop.py)"
            )
        self.turn_max_tokens = turn_max_tokens(self.rollout_config)
        self.server_manager = _LastOutput(self.server_manager)
        self._generated: list[Span] = []  # one instance runs one trajectory (verl instantiates one per run)
        self._tool_turns = 0
        self._assistant_merge: Span | None = None
        self._context_merge: Any = None

    async def run(self, sampling_params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """verl's run with the per-turn token budget in every request (verl sets no max_tokens), plus the record of
        what the server generated in the trajectory's extra_fields."""
        if self.turn_max_tokens is not None:
            sampling_params = {**sampling_params, "max_tokens": self.turn_max_tokens}
        self._generated, self._tool_turns = [], 0
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
        self._assistant_merge = None
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        if self._assistant_merge is not None:  # verl keeps the merge whatever state comes next
            self._generated.append(self._assistant_merge)
        # verl copies the server's extra_fields (global_steps, min/max_global_steps, which the trainer's step
        # metrics read) only into an empty dict; after a tool call (the CPU runs' scripted one first of all) the
        # search tool's counters are there first
        last = self.server_manager.last
        for key, value in (getattr(last, "extra_fields", None) or {}).items():
            agent_data.extra_fields.setdefault(key, value)
        return state

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
        return state


__all__ = ["AGENT_NAME", "SCRIPTING_KEYS", "SearchToolAgentLoop", "turn_max_tokens"]
