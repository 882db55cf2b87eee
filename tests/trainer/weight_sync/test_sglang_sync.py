"""The weight-sync check's sglang path (trainer/weight_sync/sglang_sync.py), on CPU: verl's real adapter against a stand-in server.

sglang does not install here. What runs is verl 0.9.1's own code: `sglang_rollout.ServerAdapter.update_weights`
(bucketing, `sgl_update_weights`, `flush_cache`, `set_global_steps`) and its HTTP client `AsyncHttpServerAdapter`
(aiohttp, retries, base64), with our mixin in front. The stand-ins play sglang's parts with the interfaces verl
and sglang use:

- sglang's Python modules verl imports, with their names (`sglang.srt.weight_sync.utils.update_weights` gathers
  the tensor-parallel group's serialized tensors and POSTs one `UpdateWeightsFromTensorReqInput` to the server);
- a real HTTP server on localhost with sglang's endpoints and payloads: `POST /update_weights_from_tensor`
  (`serialized_named_tensors` base64, one per tensor-parallel rank), `GET /flush_cache`, and
  `POST /get_weights_by_name` (`{"name", "truncate_size"}` -> rank 0's float32 `tolist()[:truncate_size]`, HF
  names sliced out of the fused `qkv_proj`/`gate_up_proj`, the row-parallel `o_proj`/`down_proj` gathered over the
  ranks as sglang's Llama does, a tied `lm_head` read from the embedding, 400 for a name the model cannot read);
  and, as sglang 0.5.12 answers by model class (srt/model_executor/model_runner.py:2133-2148), 400 for every name
  when the class has no `get_weights_by_name`: Qwen2's has none (trainer/weight_sync/sglang_readback.py, whose table a test
  derives from the sglang 0.5.12 wheel);
- per-rank models laid out as sglang's Llama with attention bias (Qwen2's tensor layout): q/k/v and gate/up fused,
  column/row-parallel shards, a vocabulary padded with zero rows and split over ranks, norms replicated, bf16
  storage (loads cast).

The trainer streams fp32 tensors; `rollout.dtype` is bf16. The one thing changed in verl's module is
`get_device_id` (CUDA only), pointed at the CPU.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import importlib
import io
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from aiohttp import web

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync import sglang_sync
from searchrl.trainer.weight_sync.sglang_readback import READBACK_ARCHITECTURES
from searchrl.trainer.weight_sync.sglang_sync import ROWS, compare_blocks, leading_block, read_copies
from searchrl.trainer.weight_sync.tap import TappedUpdateMixin
from tests.trainer.weight_sync.qwen2_stream import FFN, HIDDEN, KV, PADDED, PREFIX, VOCAB, Q, hf_weights

FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class SglangRank:
    """One tensor-parallel rank's parameters as sglang's Llama (with attention bias) holds them (bf16)."""

    def __init__(self, rank: int, tp: int) -> None:
        self.rank, self.tp = rank, tp

        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.bfloat16)

        q, kv, ffn, vocab = Q // tp, KV // tp, FFN // tp, PADDED // tp
        self.params = {
            "model.embed_tokens.weight": z(vocab, HIDDEN),
            PREFIX + "self_attn.qkv_proj.weight": z(q + 2 * kv, HIDDEN),
            PREFIX + "self_attn.qkv_proj.bias": z(q + 2 * kv),
            PREFIX + "self_attn.o_proj.weight": z(HIDDEN, q),
            PREFIX + "mlp.gate_up_proj.weight": z(2 * ffn, HIDDEN),
            PREFIX + "mlp.down_proj.weight": z(HIDDEN, ffn),
            PREFIX + "input_layernorm.weight": z(HIDDEN),
            PREFIX + "post_attention_layernorm.weight": z(HIDDEN),
            "model.norm.weight": z(HIDDEN),
        }
        self.sizes: dict[object, int] = {"q": q, "k": kv, "v": kv, 0: ffn, 1: ffn}

    def _slot(self, name: str) -> tuple[str, torch.Tensor, int]:
        """The parameter an HF tensor loads into, the view of it that holds this rank's part, the split dim."""
        for part, (fused, shard) in FUSED.items():
            if f".{part}." in name:
                param = self.params[name.replace(f".{part}.", f".{fused}.")]
                order: list[object] = ["q", "k", "v"] if fused == "qkv_proj" else [0, 1]
                offset = sum(self.sizes[s] for s in order[: order.index(shard)])
                return fused, param.narrow(0, offset, self.sizes[shard]), 0
        param = self.params[name]
        if "o_proj" in name or "down_proj" in name:
            return name, param, 1
        if "embed_tokens" in name:
            return name, param, 0
        return name, param, -1  # replicated

    def load_weights(self, named: list[tuple[str, torch.Tensor]], skip: str = "") -> None:
        for name, full in named:
            if name == "lm_head.weight" or (skip and skip in name):
                continue  # tied: the embedding is the head
            _, view, dim = self._slot(name)
            if dim == -1:
                view.copy_(full)
            elif "embed_tokens" in name:
                rows = PADDED // self.tp
                padded = torch.cat([full, torch.zeros(PADDED - VOCAB, HIDDEN)])
                view.copy_(padded[self.rank * rows : (self.rank + 1) * rows])
            else:
                view.copy_(full.chunk(self.tp, dim=dim)[self.rank])

    def get_weights_by_name(self, name: str, truncate_size: int, ranks: list[SglangRank]) -> list[Any]:
        """sglang's `LlamaForCausalLM.get_weights_by_name` on rank 0 (the all_gather over `ranks`)."""
        if name == "lm_head.weight":
            name = "model.embed_tokens.weight"
        _, view, dim = self._slot(name)
        if self.tp > 1 and dim == 1:
            view = torch.cat([r._slot(name)[1] for r in ranks], dim=1)
        rows: list[Any] = view.to(torch.float32).numpy().tolist()
        return rows[:truncate_size]


# ---- sglang's Python side, as verl imports it ----------------------------------------------------------------


@dataclasses.dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[Any]
    load_format: str | None = None
    flush_cache: bool = True


class MultiprocessingSerializer:
    """sglang's serializer (ForkingPickler, CUDA IPC on GPU); here a CPU tensor pickled whole."""

    @staticmethod
    def serialize(obj: Any, output_str: bool = False) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    @staticmethod
    def deserialize(data: bytes) -> Any:
        return torch.load(io.BytesIO(data), weights_only=False)


async def sgl_update_weights(engine, params_batch, device_mesh_key, device_mesh, load_format=None):  # type: ignore[no-untyped-def]
    """sglang's `weight_sync.utils.update_weights`: the group's serialized tensors, one request from TP rank 0."""
    mesh = device_mesh[device_mesh_key]
    if mesh.get_local_rank() != 0:
        return None
    named = [(name, tensor.detach().cpu()) for name, tensor in params_batch]
    req = UpdateWeightsFromTensorReqInput(
        serialized_named_tensors=[MultiprocessingSerializer.serialize(named) for _ in range(mesh.size)],
        load_format=load_format,
    )
    return await engine.update_weights_from_tensor(req)


class ServerArgs:
    def __init__(self, host: str = "127.0.0.1", port: int = 30000, node_rank: int = 0, **kwargs: Any) -> None:
        self.host, self.port, self.node_rank = host, port, node_rank


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules import
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)  # `import sglang.srt...` reads attributes


@pytest.fixture
def verl_sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """verl's real sglang modules and our class, imported over stand-ins for sglang's Python modules."""
    noop = lambda *a, **k: None  # noqa: E731
    _module(monkeypatch, "sglang", __version__="0.5.12")
    _module(monkeypatch, "sglang.srt")
    _module(monkeypatch, "sglang.srt.entrypoints")
    _module(monkeypatch, "sglang.srt.entrypoints.engine")
    _module(monkeypatch, "sglang.srt.entrypoints.EngineBase", EngineBase=object)
    _module(monkeypatch, "sglang.srt.entrypoints.http_server", launch_server=noop)
    _module(monkeypatch, "sglang.srt.managers")
    _module(
        monkeypatch,
        "sglang.srt.managers.io_struct",
        UpdateWeightsFromTensorReqInput=UpdateWeightsFromTensorReqInput,
    )
    _module(monkeypatch, "sglang.srt.server_args", ServerArgs=ServerArgs)
    _module(
        monkeypatch,
        "sglang.srt.utils",
        MultiprocessingSerializer=MultiprocessingSerializer,
        assert_pkg_version=noop,
        is_cuda=lambda: False,
        set_prometheus_multiproc_dir=noop,
        set_ulimit=noop,
        kill_process_tree=noop,
    )
    _module(monkeypatch, "sglang.srt.weight_sync")
    _module(
        monkeypatch,
        "sglang.srt.weight_sync.utils",
        update_weights=sgl_update_weights,
        _preprocess_tensor_for_update_weights=lambda t: t,
    )
    names = [
        "verl.workers.rollout.sglang_rollout.http_server_engine",
        "verl.workers.rollout.sglang_rollout.sglang_rollout",
        "searchrl.trainer.weight_sync.sglang_classes",
    ]
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    rollout = importlib.import_module(names[1])
    monkeypatch.setattr(rollout, "get_device_id", lambda: "cpu")  # CUDA only in verl
    classes = importlib.import_module(names[2])
    yield SimpleNamespace(
        rollout=rollout,
        http=importlib.import_module(names[0]),
        classes=classes,
        ServerAdapter=rollout.ServerAdapter,
    )
    for name in names:
        sys.modules.pop(name, None)


# ---- the stand-in server ---------------------------------------------------------------------------------------


class StandInServer:
    """sglang's HTTP endpoints verl and the check use, over `tp` ranks; `stale_after` loads, then ignores them.
    `model_class`: the architecture served; one without get_weights_by_name in sglang 0.5.12 answers 400."""

    def __init__(
        self,
        tp: int,
        *,
        stale_after: int = 99,
        skip: str = "",
        unreadable: str = "",
        model_class: str = "LlamaForCausalLM",
    ) -> None:
        self.ranks = [SglangRank(r, tp) for r in range(tp)]
        self.readable = model_class in READBACK_ARCHITECTURES
        self.stale_after, self.skip, self.unreadable = stale_after, skip, unreadable
        self.updates = 0
        self.reads: list[dict[str, Any]] = []
        self.flushes = 0

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        body = await request.json()
        payloads = body["serialized_named_tensors"]
        assert len(payloads) == len(self.ranks)  # one per tensor-parallel rank
        if self.updates < self.stale_after:
            for rank, payload in zip(self.ranks, payloads, strict=True):
                rank.load_weights(MultiprocessingSerializer.deserialize(base64.b64decode(payload)), self.skip)
        return web.json_response({"success": True, "message": "Success"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.flushes += 1
        self.updates += 1  # verl flushes once per update, after the last bucket
        return web.json_response({})

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.reads.append(body)
        name = body["name"]
        # sglang: the model class raised (no such name) or has no get_weights_by_name -> None -> 400
        if not self.readable or (self.unreadable and self.unreadable in name):
            return web.json_response({"error": {"message": "Get parameter by name failed"}}, status=400)
        rank0 = self.ranks[0]
        return web.json_response(rank0.get_weights_by_name(name, body.get("truncate_size", 100), self.ranks))

    async def __aenter__(self) -> StandInServer:
        app = web.Application()
        app.router.add_post("/update_weights_from_tensor", self.update_weights_from_tensor)
        app.router.add_get("/flush_cache", self.flush_cache)
        app.router.add_route("*", "/get_weights_by_name", self.get_weights_by_name)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


class Mesh:
    """`device_mesh["infer_tp"]` as verl and sglang read it on the tensor-parallel leader."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_local_rank(self) -> int:
        return 0


def adapter_for(verl: SimpleNamespace, server: StandInServer, tp: int, cls: type | None = None) -> Any:
    """verl's ServerAdapter (or our subclass) as `__init__` + `_init_server_adapter` leave it on a TP leader."""
    from omegaconf import OmegaConf

    adapter = object.__new__(cls or verl.classes.FingerprintServerAdapter)
    adapter.config = OmegaConf.create(
        {"dtype": "bfloat16", "quantization": None, "free_cache_engine": True,
         "checkpoint_engine": {"update_weights_bucket_megabytes": 1}}
    )  # fmt: skip
    adapter.model_config = SimpleNamespace(hf_config=SimpleNamespace(model_type="llama"))
    adapter.device_mesh = {"infer_tp": Mesh(tp)}
    adapter._pd_role = None
    adapter._engine = verl.http.AsyncHttpServerAdapter(
        model_path="m", host="127.0.0.1", port=server.port, launch_server=False, max_attempts=1
    )
    steps: list[int] = []

    async def set_global_steps(step: int) -> None:
        steps.append(step)

    adapter.server_actor = SimpleNamespace(set_global_steps=SimpleNamespace(remote=set_global_steps))
    adapter.steps = steps
    return adapter


def stream(seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    yield from hf_weights(seed).items()


def run_syncs(verl: SimpleNamespace, tp: int, steps: int, cls: type | None = None, **server_kw: Any) -> Any:
    async def go() -> Any:
        async with StandInServer(tp, **server_kw) as server:
            adapter = adapter_for(verl, server, tp, cls)
            for step in range(steps):  # the initial sync (0), then one after each trained step
                await adapter.update_weights(stream(step), global_steps=step)
            return server, adapter

    return asyncio.run(go())


# ---- the tests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2])
def test_a_real_sync_passes_through_verls_sglang_adapter(verl_sglang: SimpleNamespace, tp: int) -> None:
    server, adapter = run_syncs(verl_sglang, tp, 3)
    assert server.updates == 3 and adapter.steps == [0, 1, 2]
    names = set(hf_weights(0))
    assert {r["name"] for r in server.reads} == names and len(server.reads) == 3 * len(names)
    assert {r["truncate_size"] for r in server.reads} == {ROWS}


@pytest.mark.parametrize("tp", [1, 2])
def test_a_server_that_keeps_stale_weights_stops_the_run_at_step_2(
    verl_sglang: SimpleNamespace, tp: int
) -> None:
    with pytest.raises(
        StepCheckError, match=r"weight sync check failed at step 2 \(the update after step 1\)"
    ):
        run_syncs(verl_sglang, tp, 3, stale_after=1)


def test_verls_adapter_alone_does_not_see_a_stale_server(verl_sglang: SimpleNamespace) -> None:
    """The bug class: verl 0.9.1's adapter reports success while the server kept its old weights."""
    server, _ = run_syncs(verl_sglang, 2, 3, cls=verl_sglang.ServerAdapter, stale_after=1)
    assert server.updates == 3 and server.reads == []


def test_a_load_that_skips_a_part_of_a_fused_parameter_is_named(verl_sglang: SimpleNamespace) -> None:
    with pytest.raises(StepCheckError, match=r"at step 1 \(the initial sync\).*first: .*up_proj"):
        run_syncs(verl_sglang, 2, 1, skip="up_proj")


def test_a_tensor_the_server_cannot_read_back_fails_loudly_not_silently(verl_sglang: SimpleNamespace) -> None:
    with pytest.raises(
        StepCheckError, match=r"at step 1: sglang's /get_weights_by_name returned nothing for .*down"
    ):
        run_syncs(verl_sglang, 2, 1, unreadable="down_proj")


def test_qwen2_has_no_read_back_in_sglang_0_5_12_so_the_first_sync_stops_the_run(
    verl_sglang: SimpleNamespace,
) -> None:
    """What the default model would meet on sglang 0.5.12; the plan refuses it first (test_sglang_readback.py)."""
    with pytest.raises(
        StepCheckError,
        match=r"failed at step 1: sglang's /get_weights_by_name returned nothing for model\.embed_tokens",
    ):
        run_syncs(verl_sglang, 2, 1, model_class="Qwen2ForCausalLM")


def test_the_plugin_points_verls_sglang_rollout_at_the_checking_adapter(
    verl_sglang: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class

    default = "verl.workers.rollout.sglang_rollout.sglang_rollout.ServerAdapter"
    monkeypatch.setitem(_ROLLOUT_REGISTRY, ("sglang", "async"), default)
    sglang_sync.register()
    cls = get_rollout_class("sglang", "async")
    assert cls is verl_sglang.classes.FingerprintServerAdapter
    assert issubclass(cls, verl_sglang.ServerAdapter)
    assert issubclass(cls, sglang_sync.SglangFingerprintMixin)
    assert cls.update_weights is TappedUpdateMixin.update_weights  # the tap both engine adapters share
    assert _ROLLOUT_REGISTRY[("vllm", "async")].startswith(
        "searchrl.trainer.weight_sync.vllm_classes"
    )  # vLLM's untouched


def test_blocks_compare_exactly_and_read_the_server_reply_shapes() -> None:
    sent = {"w": leading_block(torch.randn(6, 3), torch.bfloat16), "b": leading_block(torch.randn(5), None)}
    assert sent["w"].shape == (ROWS, 3) and sent["w"].dtype == torch.float32
    replies = {"w": sent["w"].tolist(), "b": sent["b"].tolist()}
    compare_blocks(replies, sent, 0)
    # a row-parallel shard the model class did not gather: the same rows, its leading columns
    compare_blocks({**replies, "w": sent["w"][:, :1].tolist()}, sent, 0)
    # one element one bf16 step off
    off = sent["w"].clone()
    off[1, 2] = torch.nextafter(off[1, 2].to(torch.bfloat16), torch.tensor(9.0, dtype=torch.bfloat16)).float()
    with pytest.raises(StepCheckError, match=r"at step 4 \(the update after step 3\).*first: w"):
        compare_blocks({**replies, "w": off.tolist()}, sent, 3)
    # dp > 1: one list per data-parallel rank, each checked
    assert len(read_copies([sent["b"].tolist(), sent["b"].tolist()], 1)) == 2
    assert read_copies([], 2) == [] and read_copies({"error": "x"}, 2) == []
