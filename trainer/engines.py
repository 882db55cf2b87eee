"""The rollout engines in one table: which a GPU run locks and launches, which `searchrl train cpu --rollout` takes,
and the weight-sync plugin each names for verl.

Before this table the engine list was spelled in the settings' Literal, the locks, the overrides' plugin map and the
CPU run's `--rollout` choices (issue 54 item 5): a fourth engine added to one of them would have been refused, or
silently run without its weight-sync check, by another. Stdlib only: the settings, the lock tooling and the CLI
import it before anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# The GPU run's engines as the settings type them (ROLLOUT); `GPU_ENGINES` below must list the same names, which
# tests/trainer/test_engines.py holds.
RolloutName = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class Engine:
    """One rollout engine: where it runs and what verl imports for it."""

    name: str
    # the module that registers our fingerprint-checking classes in verl's registries (None: the hf CPU engine
    # registers its own server through trainer/cpu/plugin.py)
    sync_plugin: str | None
    gpu: bool  # a GPU run launches it, from its own lock (requirements/gpu-<name>-py3XX.txt)
    cpu: bool  # the CPU proof runs take it (`searchrl train cpu --rollout`, `make train-cpu ROLLOUT=`)


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("vllm", "searchrl.trainer.weight_sync.vllm_sync", gpu=True, cpu=True),
        Engine("sglang", "searchrl.trainer.weight_sync.sglang_sync", gpu=True, cpu=False),
        # ours, CPU only (trainer/cpu/hf_rollout.py): the CPU runs' default, never a GPU run's
        Engine("hf", None, gpu=False, cpu=True),
    )
}
GPU_ENGINES: tuple[str, ...] = tuple(name for name, e in ENGINES.items() if e.gpu)
CPU_ENGINES: tuple[str, ...] = tuple(name for name, e in ENGINES.items() if e.cpu)
SYNC_PLUGINS: dict[str, str] = {name: e.sync_plugin for name, e in ENGINES.items() if e.sync_plugin}

assert GPU_ENGINES == get_args(RolloutName), "RolloutName and the table disagree"  # noqa: S101 (import-time guard)

__all__ = ["CPU_ENGINES", "ENGINES", "GPU_ENGINES", "SYNC_PLUGINS", "Engine", "RolloutName"]
