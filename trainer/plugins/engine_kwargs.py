"""`actor_rollout_ref.rollout.engine_kwargs.searchrl`: our agent loops' keys in verl's rollout config.

verl's rollout config takes a free-form `engine_kwargs` mapping, one block per engine, and hands each engine only its
own block (`vllm`, `sglang`). Our agent loops' keys are no engine's, so they have a block of their own, which the
runs add with hydra's `+` prefix (`+{SEARCHRL_KWARGS}.<key>=...`). Who reads which key:

    turn_max_tokens       the agent loop, on every run (trainer/plugins/agent_loop.py `turn_max_tokens`)
    scripted_first_turn   the CPU runs' scripted agent loop (trainer/cpu/scripted_agent_loop.py)
    scripted_opening      the same loop (`make learn-cpu-real --stage query`)
    close_answer          make learn-search's agent loop (trainer/proofs/search_agent_loop.py)
    close_query           the same loop
    answer_max_tokens     the same loop (`make learn-search --answer-tokens`)

An engine's own keys stay in that engine's block, read by the engine. The reader lives here, on the production side,
so the agent loop a GPU run imports reads its keys without importing the CPU rooms, and the CPU agent loops read
theirs the same way.
"""

from __future__ import annotations

from typing import Any

SEARCHRL_BLOCK = "searchrl"
# the dotted key of our block in verl's config: writers add `+{SEARCHRL_KWARGS}.<key>=<value>`
SEARCHRL_KWARGS = f"actor_rollout_ref.rollout.engine_kwargs.{SEARCHRL_BLOCK}"


def engine_kwargs_block(rollout_config: Any, block: str) -> dict[str, Any]:
    """The `engine_kwargs.<block>` mapping of verl's rollout config (a DictConfig, verl's RolloutConfig or a plain
    object), {} when the run sets none."""
    engine_kwargs = getattr(rollout_config, "engine_kwargs", None) or {}
    found = engine_kwargs.get(block) if hasattr(engine_kwargs, "get") else None
    return dict(found or {})


def searchrl_engine_kwargs(rollout_config: Any) -> dict[str, Any]:
    """Our agent loops' keys (`engine_kwargs.searchrl`, module docstring), {} when the run sets none."""
    return engine_kwargs_block(rollout_config, SEARCHRL_BLOCK)


__all__ = ["SEARCHRL_BLOCK", "SEARCHRL_KWARGS", "engine_kwargs_block", "searchrl_engine_kwargs"]
