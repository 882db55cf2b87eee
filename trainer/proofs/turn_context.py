"""The context a model's own turn follows in the CPU learning runs: prompt, scripted search call, the tool's reply.

`make learn-cpu`'s probe (trainer/proofs/learn.py) and `make learn-cpu-real`'s variance gate (trainer/proofs/real_gate.py)
both score what the model does right after the scripted call's real tool response, outside verl. They must see
the text the rollouts saw, so the response comes from the search tool built from the run's own tool YAML, as verl
builds it, against the run's service, and the ids from the tokenizer's chat template with the tool schema.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from searchrl.trainer.settings import TrainSettings


def search_responses(settings: TrainSettings, questions: Sequence[str], call_id: str) -> list[str]:
    """The search tool's response text to `search(query_list=[question])`, per question, in order."""
    from verl.tools.tool_registry import load_all_tools

    async def responses() -> list[str]:
        tools: list[Any] = load_all_tools(str(settings.resolved_tool_config_path), None)
        (tool,) = tools
        try:
            texts = []
            for question in questions:
                response, _, _ = await tool.execute(call_id, {"query_list": [question]})
                texts.append(response.text or "")
            return texts
        finally:
            await tool.aclose()

    return asyncio.run(responses())


def turn_context_ids(
    tokenizer: Any, prompt: Sequence[Mapping[str, Any]], question: str, observation: str
) -> list[int]:
    """Token ids of the prompt, the scripted call and the tool's response, ending where the model's turn opens."""
    from searchrl.trainer.cpu.scripted_agent_loop import scripted_tool_call

    messages = [
        *[dict(m) for m in prompt],
        {"role": "assistant", "content": scripted_tool_call(question)},
        {"role": "tool", "content": observation},
    ]
    return chat_ids(tokenizer, messages)


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The chat template's token ids for `messages` with the search tool's schema, ending where the model's turn
    opens (transformers returns a list or, in newer versions, a BatchEncoding)."""
    from searchrl.prompt import SEARCH_TOOL_SCHEMA

    ids = tokenizer.apply_chat_template(
        list(messages), tools=[SEARCH_TOOL_SCHEMA], add_generation_prompt=True, tokenize=True
    )
    ids = ids["input_ids"] if isinstance(ids, Mapping) or hasattr(ids, "keys") else ids
    return [int(i) for i in ids]


__all__ = ["chat_ids", "search_responses", "turn_context_ids"]
