"""`actor_rollout_ref.rollout.engine_kwargs.hf`: our keys in verl's rollout config, read by both sides.

verl's rollout config takes a free-form `engine_kwargs` mapping (one block per engine); the runs add keys under
`hf` with hydra's `+` prefix. Who reads which key:

    turn_max_tokens       the agent loop, on every run (trainer/plugins/agent_loop.py `turn_max_tokens`)
    scripted_first_turn   the CPU runs' scripted agent loop (trainer/cpu/scripted_agent_loop.py)
    scripted_opening      the same loop (`make learn-cpu-real --stage query`)
    dtype, max_batch,     the hf rollout engine (trainer/cpu/hf_rollout.py)
    threads

The reader lives here, on the production side, so the agent loop a GPU run imports reads `turn_max_tokens`
without importing the CPU engine, and the CPU modules read their keys the same way.
"""

from __future__ import annotations

from typing import Any


def hf_engine_kwargs(rollout_config: Any) -> dict[str, Any]:
    """The `engine_kwargs.hf` block of verl's rollout config, {} when the run sets none."""
    engine_kwargs = getattr(rollout_config, "engine_kwargs", None) or {}
    hf = engine_kwargs.get("hf") if hasattr(engine_kwargs, "get") else None
    return dict(hf or {})


__all__ = ["hf_engine_kwargs"]
