"""RolloutSpec: the budgets and rules an episode runs under, shared by training (verl) and evaluation (infer).

A model trained under one set of rules and evaluated under another is measured on a task it never saw. So the
numbers that shape an episode live here once, and both sides read them:

- trainer/settings.py takes its defaults from `ROLLOUT_DEFAULTS` and exposes `TrainSettings.rollout`, built by
  `RolloutSpec.from_settings`; trainer/overrides.py renders verl's `multi_turn.*` and `data.max_*_length` keys
  from that spec.
- infer/settings.py does the same through the same builder, and the agent loop (infer/agent.py) enforces the spec turn for turn the way
  verl 0.9.1's ToolAgentLoop does (`verl/experimental/agent_loop/tool_agent_loop.py`):
  * at most `max_turns` tool turns and `max_turns + 1` assistant turns (`max_user_turns`,
    `max_assistant_turns`);
  * only the first `max_parallel_calls` tool calls of a turn run (`agent_data.tool_calls[:max_parallel_calls]`);
  * the trajectory after the prompt is capped at `max_response_tokens` tokens, observations included; the
    episode ends once it is reached, and an observation that would cross it is not appended;
  * a turn may generate what is left of `max_prompt_tokens + max_response_tokens` (capped at
    `max_response_tokens`): the rule verl's sglang server applies when the sampling params carry no
    `max_tokens` (`async_sglang_server.py`), which is how training runs. `max_tokens_per_turn` adds a per-turn
    cap on top, for eval only; it is off by default because training has none.
- The tool schema the model reads is verl's rendering (`OpenAIFunctionToolSchema(...).model_dump(
  exclude_unset=True, exclude_none=True)`, which drops `items` from array properties), not our raw dict.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from searchrl.prompt import SEARCH_TOOL_SCHEMA, observation_budget

PromptFormat = Literal["searchrl", "search-r1"]

# What verl 0.9.1 renders for SEARCH_TOOL_SCHEMA; used when verl is not installed (the infer extra does not pull
# it). tests/infer/test_parity.py asserts it equals verl's own rendering, so it cannot drift silently.
TRAINING_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": SEARCH_TOOL_SCHEMA["function"]["description"],
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "description": SEARCH_TOOL_SCHEMA["function"]["parameters"]["properties"]["query_list"][
                        "description"
                    ],
                }
            },
            "required": ["query_list"],
        },
    },
}


def verl_rendered_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as verl's ToolAgentLoop passes it to the chat template (its `tool_schemas` attribute)."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True)


def training_tool_schemas() -> list[dict[str, Any]]:
    """The `tools=` list the model saw in training: verl's rendering when verl is importable, else the pin."""
    try:
        return [verl_rendered_schema(SEARCH_TOOL_SCHEMA)]
    except ImportError:
        return [TRAINING_TOOL_SCHEMA]


def truncate_tool_response(text: str, limit: int) -> str:
    """verl's cut of an over-long tool response (ToolAgentLoop._call_tool, truncate side "right", as our
    overrides set it): the first `limit` characters plus "...(truncated)". Our tool caps its text at the same
    budget, marker included, so this never fires for it; eval applies the rule anyway so that any text over the
    budget reads exactly as verl would have shown it."""
    if text and len(text) > limit:
        return text[:limit] + "...(truncated)"
    return text


# The most passages a query may ask for: the retrieval service's default max_topk (retrieval/settings.py), and the
# bound of every topk knob (trainer, tool config, inference), declared once.
MAX_TOPK = 50


class RolloutSpec(BaseModel):
    """The rules of one episode; every field is part of the evaluation protocol."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(default=4, ge=1)  # tool turns; assistant turns are max_turns + 1
    max_prompt_tokens: int = Field(default=1024, ge=64)  # verl data.max_prompt_length
    max_response_tokens: int = Field(default=4096, ge=64)  # verl data.max_response_length: whole trajectory
    max_tokens_per_turn: int | None = Field(default=None, ge=1)  # None = training's rule (what is left)
    max_parallel_calls: int = Field(default=1, ge=1)  # tool calls run per turn (verl multi_turn)
    topk: int = Field(default=3, ge=1, le=MAX_TOPK)  # passages per query
    passage_max_chars: int = Field(default=800, ge=50)  # cap per passage text
    prompt_format: PromptFormat = "searchrl"  # searchrl: hermes tool calls | search-r1: <search> tags

    @classmethod
    def from_settings(cls, settings: BaseModel, **renamed: str) -> RolloutSpec:
        """The spec an area's settings describe: every spec field they define under the same name, plus
        `renamed` (spec field -> the settings' own name: the trainer's are verl's `max_*_length`). The one
        builder for trainer and infer, so a field added here reaches both wherever their settings carry it; a
        field they lack keeps training's default (the trainer has no per-turn cap, one call a turn)."""
        own = type(settings).model_fields
        names = {field: renamed.get(field, field) for field in cls.model_fields}
        unknown = sorted(({*renamed} - {*cls.model_fields}) | ({*renamed.values()} - {*own}))
        if unknown:
            raise ValueError(
                f"RolloutSpec.from_settings: no such field {unknown} on the spec or the settings"
            )
        return cls(**{field: getattr(settings, name) for field, name in names.items() if name in own})

    @property
    def max_assistant_turns(self) -> int:
        return self.max_turns + 1

    @property
    def observation_chars(self) -> int:
        """The observation cap in characters (verl's max_tool_response_length, the tool's own cap)."""
        return observation_budget(self.topk, self.passage_max_chars)

    def turn_token_budget(self, context_tokens: int) -> int:
        """New tokens the next turn may generate, given the tokens already in context (prompt + response)."""
        left = min(
            self.max_response_tokens, self.max_prompt_tokens + self.max_response_tokens - context_tokens
        )
        if self.max_tokens_per_turn is not None:
            left = min(left, self.max_tokens_per_turn)
        return max(0, left)


ROLLOUT_DEFAULTS = RolloutSpec()

__all__ = [
    "MAX_TOPK",
    "ROLLOUT_DEFAULTS",
    "TRAINING_TOOL_SCHEMA",
    "PromptFormat",
    "RolloutSpec",
    "training_tool_schemas",
    "truncate_tool_response",
    "verl_rendered_schema",
]
