"""The exact weight-sync check on vLLM (issue 39 item 1): the rollout's workers fingerprint what they hold.

verl 0.9.1 syncs vLLM weights in `ServerAdapter.update_weights` (workers/rollout/vllm_rollout/vllm_rollout.py): the
trainer streams named tensors over ZMQ to every vLLM worker, whose extension `vLLMColocateWorkerExtension`
(vllm_rollout/utils.py) loads them with the model's own `load_weights`. Nothing reads back what the workers hold;
a load that silently kept old weights (TRL #5312) shows only as a small probability difference. Three hooks, each
the smallest verl offers, add the check (the classes that need vLLM live in trainer/weight_sync/vllm_classes.py):

- worker: `FingerprintWorkerMixin.weight_fingerprint()` in the worker extension prints the parameters this
  tensor-parallel rank holds (trainer/weight_sync/fingerprint.py), with the model's `packed_modules_mapping` (which HF
  tensors vLLM fuses, e.g. q/k/v into `qkv_proj`) and whether `lm_head` is tied to the embedding;
- server: verl's `vLLMHttpServer.collective_rpc` awaits the workers but drops their results
  (vllm_async_server.py:249-261); `FingerprintServerMixin.collective_rpc` returns them (one per rank), and the
  server names the extension class (`_get_worker_extension_cls`, the hook verl provides for it);
- adapter: `FingerprintAdapterMixin`, on the tap both engines share (trainer/weight_sync/tap.py), prints each
  tensor as verl's stream passes through (cast to the rollout dtype, `rollout.dtype`), lets verl send and load
  them, then asks the workers through verl's own
  `_execute_method` -> `collective_rpc` and compares: the parts of a fused parameter are summed, a split
  parameter's ranks are summed and a replicated one is read once (`merge_ranks`). A mismatch raises
  StepCheckError naming the step; verl's `ray.get` on the update re-raises it and the run stops. Only ranks with
  a server check; every rank then agrees (`agree_across_ranks`), so ranks without one stop within seconds too
  instead of waiting in verl's next collective for torch's timeout. A match prints one line from the rank that
  checked it (`step_checks.SYNC_MATCH_LINE`, with the digest of what the trainer sent in vLLM's names), which the
  run's log collects through Ray and a run counts (`step_checks.checks_line`).

Registered for `rollout.name=vllm` by importing this module in every Ray process: `render_overrides` passes
`VERL_USE_EXTERNAL_MODULES=searchrl.trainer.weight_sync.vllm_sync` through `ray_kwargs.ray_init.runtime_env.env_vars`, and
verl imports the named modules at `import verl` (verl/__init__.py). Importing this module needs no vLLM.

Not covered: LoRA adapter updates and verl's `delta_flush` wire format (only full named-tensor updates are
checked); an MTP draft model; models whose vLLM names need a `hf_to_vllm_mapper` beyond fused modules (their
tensors show as "missing on the rollout": loud, not silent). KV heads repeated over more tensor-parallel ranks
than the model has are counted (`num_kv_head_replicas`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync.fingerprint import (
    TensorPrint,
    check_sync,
    digest,
    group_sent,
    merge_ranks,
    tensor_print,
)
from searchrl.trainer.weight_sync.tap import TappedUpdateMixin

log = logging.getLogger(__name__)

ROLLOUT_NAME = "vllm"
CLASSES = "searchrl.trainer.weight_sync.vllm_classes"
# What a GPU run passes to every Ray process (trainer/overrides.py): verl imports it at `import verl`.
PLUGIN_ENV_VAR = "VERL_USE_EXTERNAL_MODULES"
RPC_METHOD = "weight_fingerprint"
RPC_TIMEOUT_S = 600.0

# ---- worker side (inside each vLLM worker process) ------------------------------------------------------------


class FingerprintWorkerMixin:
    """Added to verl's worker extension: `weight_fingerprint()` is what `collective_rpc` runs on every rank."""

    model_runner: Any

    def weight_fingerprint(self) -> dict[str, Any]:
        """This rank's parameter prints, plus what the trainer needs to map HF names onto them."""
        model = self.model_runner.model
        prints = {
            name: tuple(tensor_print(p.data)) for name, p in model.named_parameters()
        }  # vLLM subclasses
        packed = getattr(model, "packed_modules_mapping", None) or {}
        vllm_config = getattr(self.model_runner, "vllm_config", None)  # as verl's extension reads it
        hf_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
        # vLLM's QKVParallelLinear repeats each KV head on `num_kv_head_replicas` ranks when tensor parallelism
        # exceeds the model's KV heads: the ranks' k/v shards then sum to that many copies of k and v
        kv_replicas = {}
        for module_name, module in model.named_modules():
            copies = getattr(module, "num_kv_head_replicas", 1)
            if isinstance(copies, int) and copies > 1:
                for param_name, _ in module.named_parameters(recurse=False):
                    kv_replicas[f"{module_name}.{param_name}" if module_name else param_name] = copies
        return {
            "prints": prints,
            "packed": {fused: list(parts) for fused, parts in packed.items()},
            "tied": bool(getattr(hf_config, "tie_word_embeddings", False)),
            "kv_replicas": kv_replicas,
        }


# ---- server side (the vLLMHttpServer Ray actor) ---------------------------------------------------------------


class FingerprintServerMixin:
    """Added to verl's `vLLMHttpServer`: its `collective_rpc` returns the workers' results (verl's drops them)."""

    engine: Any

    async def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)


# ---- trainer side (verl's ServerAdapter in each training worker) ----------------------------------------------


def vllm_param_name(name: str, held: set[str], packed: Mapping[str, Iterable[str]], tied: bool) -> str | None:
    """The vLLM parameter an HF tensor loads into: itself, or the fused parameter it is part of (vLLM's
    `stacked_params_mapping` rule: `.q_proj.` -> `.qkv_proj.`); None for a tied `lm_head.weight`."""
    if name in held:
        return name
    for fused, parts in packed.items():
        for part in parts:
            candidate = name.replace(f".{part}.", f".{fused}.")
            if candidate != name and candidate in held:
                return candidate
    if tied and name == "lm_head.weight":
        return None
    return name


def check_vllm_sync(reports: Any, sent: Mapping[str, TensorPrint], global_steps: int | None) -> str:
    """Compare the workers' reports (one per tensor-parallel rank) with the trainer's prints of what it sent;
    StepCheckError on a difference, else the digest of what matched (the sent prints under vLLM's names)."""
    if not reports or not all(isinstance(r, Mapping) and "prints" in r for r in reports):
        step = int(global_steps or 0) + 1
        raise StepCheckError(
            f"weight sync check failed at step {step}: the vLLM workers returned no fingerprint ({reports!r}); "
            f"is the worker extension {CLASSES}.SearchRLWorkerExtension in use?"
        )
    ranks = [{name: TensorPrint(*p) for name, p in r["prints"].items()} for r in reports]
    held_names = set().union(*ranks)
    packed, tied = reports[0].get("packed", {}), bool(reports[0].get("tied"))
    kv_replicas = reports[0].get("kv_replicas", {})
    targets = {name: vllm_param_name(name, held_names, packed, tied) for name in sent}
    scaled = {}
    for name, p in sent.items():
        target = targets[name]
        copies = kv_replicas.get(target, 1) if target is not None and _is_kv_part(name, target, packed) else 1
        scaled[name] = p.times(copies) if copies > 1 else p
    grouped = group_sent(scaled, targets.__getitem__)
    check_sync(merge_ranks(grouped, ranks), grouped, global_steps)
    return digest(grouped)


def _is_kv_part(name: str, target: str, packed: Mapping[str, Iterable[str]]) -> bool:
    """Whether HF tensor `name` is a k or v part (not the first, q) of the fused parameter `target`."""
    for fused, parts in packed.items():
        for index, part in enumerate(parts):
            if index > 0 and name.replace(f".{part}.", f".{fused}.") == target and name != target:
                return True
    return False


class FingerprintAdapterMixin(TappedUpdateMixin[TensorPrint]):
    """Added to verl's vLLM `ServerAdapter`: after verl's update, check what the workers hold (trainer/weight_sync/
    tap.py wraps verl's `update_weights`)."""

    # verl's ServerAdapter provides these (annotations only: a method here would shadow verl's)
    _has_server: bool
    _execute_method: Any

    def keep_sent(
        self, sent: dict[str, TensorPrint], name: str, tensor: torch.Tensor, dtype: torch.dtype | None
    ) -> None:
        sent[name] = tensor_print(tensor, dtype)

    def reads_rollout(self) -> bool:
        return self._has_server

    async def check_rollout(self, sent: dict[str, TensorPrint], global_steps: int | None) -> str:
        return check_vllm_sync(
            await self._execute_method(RPC_METHOD, timeout=RPC_TIMEOUT_S), sent, global_steps
        )


# ---- registration ---------------------------------------------------------------------------------------------


def _load_replica() -> type:
    from searchrl.trainer.weight_sync.vllm_classes import FingerprintReplica

    return FingerprintReplica


def register() -> None:
    """Point verl's `vllm` rollout at the fingerprinting classes (both registries; no vLLM import here)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{CLASSES}.FingerprintServerAdapter"


register()

__all__ = [
    "CLASSES",
    "PLUGIN_ENV_VAR",
    "RPC_METHOD",
    "FingerprintAdapterMixin",
    "FingerprintServerMixin",
    "FingerprintWorkerMixin",
    "check_vllm_sync",
    "register",
    "vllm_param_name",
]
