"""verl 0.9.1 on CPU: a CPU platform, the `hf` rollout engine, and four small patches (`make train-cpu`).

verl ships CUDA, NPU and ROCm platforms and the vLLM, sglang and TensorRT-LLM rollout engines; none runs on a
machine without an accelerator. This module adds what is missing through verl's own extension points, and is
imported by every process of the run, Ray workers included, because trainer/proofs/train_cpu.py sets
`VERL_USE_EXTERNAL_MODULES=searchrl.trainer.cpu.plugin` and `VERL_PLATFORM=cpu` (verl/__init__.py imports the
named modules at `import verl`; verl/plugin/platform/platform_manager.py reads VERL_PLATFORM):

1. `PlatformCPU`, registered in verl's `PlatformRegistry` as "cpu": device "cpu", collectives on gloo, a device
   module whose memory and cache calls are no-ops. Its Ray resource stays "GPU": verl's ResourcePoolManager asks
   Ray for GPUs unconditionally (single_controller/ray/base.py:210, 226-242), so the run gives Ray one fake GPU.
2. The CPU runs' agent loop, `searchrl_scripted_tool_agent` (trainer/cpu/scripted_agent_loop.py: the scripted
   first turn as environment), in verl's agent-loop registry; and the `hf` rollout engine (trainer/cpu/hf_rollout.py) in both of
   verl's registries: `RolloutReplicaRegistry` (the
   server the agent loop calls) and `_ROLLOUT_REGISTRY` (the adapter in the training worker that receives the
   weights after every update). The FSDP training engine is chosen with verl's own `VERL_ENGINE_DEVICE=cuda`
   override: it is registered for cuda/npu only (workers/engine/fsdp/transformer_impl.py:1143) but runs on CPU.

Patches to verl's behaviour (each the smallest that works; trainer/patches/README.md lists them with verl's lines):

- `initialize_global_process_group_ray` asks for the backend string `"cpu:gloo,<device>:<backend>"`
  (utils/distributed.py:88), which torch rejects when the device is also "cpu" ("Duplicate device type cpu"):
  on this platform it gets plain "gloo".
- verl's FSDP2 "save to CPU" of the old policy (`separate_async`, `parameter_sync_step` > 1) keeps the live
  parameter itself when it is already on CPU: trainer/patches/old_policy_guard.py (imported below) makes it a copy.
- verl's `separate_async` trainer passes `flush=True` to `logger.info` when the rollout has its own pool
  (`hybrid_engine=False`), a TypeError: trainer/patches/separate_async.py (imported below) drops the kwarg.
- The reference model's FSDP2 offload policy is `CPUOffloadPolicy(pin_memory=True)`
  (workers/engine/fsdp/transformer_impl.py:462); pinning needs an accelerator ("Cannot access accelerator device
  when none is available"), so the policy is built with `pin_memory=False`. On CPU the "offload" is a no-op.

Nothing here is imported on a GPU run: the overrides of `searchrl train local` never name this module.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformRegistry
from verl.plugin.platform.platform_base import PlatformBase

from searchrl.trainer.cpu import sabotage
from searchrl.trainer.patches import old_policy_guard, separate_async, step_line

log = logging.getLogger(__name__)

PLATFORM = "cpu"
ROLLOUT_NAME = "hf"
# What trainer/proofs/train_cpu.py puts in the environment of the run (Ray workers inherit it).
ENV = {
    "VERL_USE_EXTERNAL_MODULES": __name__,
    "VERL_PLATFORM": PLATFORM,
    "VERL_ENGINE_DEVICE": "cuda",
}


class _CPUDeviceModule(types.ModuleType):
    """`torch.cpu` plus the cache, memory and RNG calls verl makes on `get_torch_device()` (no-ops on CPU)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(_device: Any) -> None:
        return None

    @staticmethod
    def get_device_name(_device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def mem_get_info(_device: Any = None) -> tuple[int, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, os.sysconf("SC_PHYS_PAGES") * size

    @staticmethod
    def memory_allocated(_device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def set_per_process_memory_fraction(_fraction: float, _device: Any = None) -> None:
        return None

    @staticmethod
    def get_rng_state(_device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, _device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


_DEVICE_MODULE = _CPUDeviceModule("searchrl_cpu_device")


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface for a machine without an accelerator."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so a GPU node that imports us stays on CUDA.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes this straight to `.to(device=...)` and FSDP's device_id: an int would mean an accelerator
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # see the module docstring: verl's resource pools always ask Ray for GPUs

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _register_rollout() -> None:
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica() -> type:
        from searchrl.trainer.cpu.hf_rollout import HFRolloutReplica

        return HFRolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (
        "searchrl.trainer.cpu.hf_rollout.HFServerAdapter"
    )


def _register_agent_loop() -> None:
    """The CPU runs' agent loop (trainer/cpu/scripted_agent_loop.py), in verl's registry of agent loops by name
    (beside its parent, `searchrl_tool_agent`, which importing it registers too)."""
    from searchrl.trainer.cpu.scripted_agent_loop import SCRIPTED_AGENT_NAME  # noqa: F401  (importing registers)


def _patch_for_cpu() -> None:
    """The two patches of the module docstring; only on the CPU platform."""
    from verl.utils import distributed, fsdp_utils

    # typed here: verl leaves it unannotated
    original_init: Callable[..., None] = distributed.initialize_global_process_group_ray

    def initialize_gloo(timeout_second: int | None = None, backend: str | None = None) -> None:
        original_init(timeout_second=timeout_second, backend=backend or "gloo")

    distributed.initialize_global_process_group_ray = initialize_gloo

    policy = fsdp_utils.CPUOffloadPolicy
    if policy is not None and not getattr(policy, "_searchrl_unpinned", False):

        class UnpinnedCPUOffloadPolicy(policy):  # type: ignore[misc, valid-type]
            _searchrl_unpinned = True

            def __init__(self, pin_memory: bool = False) -> None:
                super().__init__(pin_memory=False)

        fsdp_utils.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[misc]  # the patch: a class global


_register_rollout()
_register_agent_loop()
# idempotent; importing them installed them already: named here so the imports are not unused
old_policy_guard.install()
separate_async.install()
step_line.install()
if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
    _patch_for_cpu()
if sabotage.active(sabotage.FLIP_ADVANTAGE):
    sabotage.flip_advantages()
if sabotage.active(sabotage.SHUFFLE_REWARDS):
    sabotage.shuffle_rewards()

__all__ = ["ENV", "PLATFORM", "ROLLOUT_NAME", "PlatformCPU"]
