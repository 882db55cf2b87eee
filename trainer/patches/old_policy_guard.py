"""Keep verl's saved "old policy" a copy: its FSDP2 save to CPU aliases the live weights when they already are on CPU.

verl 0.9.1's `separate_async` trainer with `parameter_sync_step` P > 1 and no `rollout_correction.bypass_mode`
runs decoupled PPO: at the first of P local updates it saves the current weights as pi_old
(`save_model_to_cpu(0)`), and before each later update's old-log-prob pass it saves the current weights, restores
pi_old, computes, and restores the current ones (trainer/ppo/v1/trainer_separate_async.py:187-211,
experimental/separation/engine_workers.py:123-169). For FSDP2 the save is `fsdp2_sharded_save_to_cpu`
(utils/fsdp_utils.py:1146-1185), which keeps `param._local_tensor.detach().cpu()`: `.cpu()` of a tensor already on
CPU returns the tensor itself, so on a CPU run (and on GPUs with parameter offload, the caveat at
engine_workers.py:82-85) the "saved" pi_old is the live parameter storage. Every optimizer step moves it, the
restore's `copy_` copies a tensor onto itself, and old_log_prob silently equals the current policy's: the PPO ratio
is 1 at every update, with no error. FSDP1's save copies (`to("cpu", copy=True)`) and is not affected.

The guard wraps `verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu` so that any saved tensor sharing storage with
its live parameter is cloned; a save that already copied (GPU weights on GPU) is returned unchanged, so nothing
changes where verl was right. verl's worker looks the function up in the module at call time (engine_workers.py:
94-99), so patching the module attribute reaches it, provided this module is imported in the actor's process
before its first save: trainer/cpu/plugin.py imports it (every process of a CPU run imports the plugin); a GPU run
needs it in the `VERL_USE_EXTERNAL_MODULES` list too (trainer/overrides.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_PATCHED = "_searchrl_clones_aliases"


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


def guard_save(save: Callable[[torch.nn.Module], Any]) -> Callable[[torch.nn.Module], Any]:
    """`save` (verl's fsdp2_sharded_save_to_cpu), with every saved tensor that aliases a live parameter cloned."""

    def save_copies(model: torch.nn.Module) -> Any:
        state, spec = save(model)
        live = {
            name: getattr(param, "_local_tensor", param).detach() for name, param in model.named_parameters()
        }
        copied = {}
        for name, (tensor, tensor_spec) in state.items():
            if name in live and _storage(tensor) == _storage(live[name]):
                tensor = tensor.clone()
            copied[name] = (tensor, tensor_spec)
        return copied, spec

    setattr(save_copies, _PATCHED, True)
    save_copies.__doc__ = save.__doc__
    save_copies.__wrapped__ = save  # type: ignore[attr-defined]
    return save_copies


def install() -> None:
    """Patch verl's module attribute once (importing this module calls it)."""
    from verl.utils import fsdp_utils

    if not getattr(fsdp_utils.fsdp2_sharded_save_to_cpu, _PATCHED, False):
        fsdp_utils.fsdp2_sharded_save_to_cpu = guard_save(fsdp_utils.fsdp2_sharded_save_to_cpu)  # type: ignore[assignment]


install()

__all__ = ["guard_save", "install"]
