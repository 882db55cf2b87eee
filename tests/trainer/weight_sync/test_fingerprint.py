"""The exact weight-sync check (issue 39 item 1): the fingerprint, and the `hf` engine's use of it.

The fingerprint must be equal for equal weights whatever the order, device split or fusing, and differ after a
single element moves by one ulp; the `hf` server must report what it holds (not what it was sent), and the adapter
must stop the run with one line naming the step when the two differ (sabotage `stale_sync`).
"""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from searchrl.errors import StepCheckError
from searchrl.trainer.cpu import sabotage
from searchrl.trainer.cpu.hf_rollout import HFGenerateServer, HFServerAdapter
from searchrl.trainer.weight_sync.fingerprint import (
    TensorPrint,
    check_sync,
    digest,
    fingerprint,
    group_sent,
    merge_ranks,
    tensor_print,
)


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(4, 8, generator=g),
        "model.norm.weight": torch.ones(8),
    }


def test_a_copy_prints_equal_and_one_ulp_anywhere_does_not():
    weights = _weights()
    copy = {name: t.clone() for name, t in weights.items()}
    assert fingerprint(weights.items()) == fingerprint(copy.items())
    for name, t in weights.items():
        bumped = dict(copy)
        changed = t.clone().reshape(-1)
        changed[-1] = torch.nextafter(changed[-1], torch.tensor(float("inf")))  # the smallest change fp32 has
        bumped[name] = changed.reshape(t.shape)
        assert fingerprint(bumped.items())[name] != fingerprint(weights.items())[name], name
        assert digest(fingerprint(bumped.items())) != digest(fingerprint(weights.items()))


def test_prints_are_in_the_rollouts_dtype_bit_for_bit():
    w = torch.randn(64, 32)
    as_bf16 = tensor_print(w, torch.bfloat16)
    assert as_bf16 == tensor_print(w.to(torch.bfloat16))  # the cast a bf16 rollout's load does
    assert as_bf16.dtype == "bfloat16" and tensor_print(w).dtype == "float32"
    assert not as_bf16.same_values(tensor_print(w))  # fp32 bits are not bf16 bits
    # a change bf16 cannot hold is not a change of what a bf16 rollout holds
    tiny = w.clone()
    tiny[0, 0] = torch.nextafter(tiny[0, 0], torch.tensor(float("inf")))
    assert tensor_print(tiny, torch.bfloat16) == as_bf16


def test_the_named_stream_order_does_not_matter_and_a_name_twice_is_refused():
    items = list(_weights().items())
    assert fingerprint(items) == fingerprint(reversed(items))
    assert digest(fingerprint(items)) == digest(fingerprint(reversed(items)))
    with pytest.raises(ValueError, match="appears twice"):
        fingerprint(items + items[:1])


def test_fused_parts_tensor_parallel_shards_and_zero_padding_add_up():
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    fused = torch.cat([q, k, v])
    assert tensor_print(fused).same_values(tensor_print(q) + tensor_print(k) + tensor_print(v))
    shards = fused.chunk(2, dim=1)
    assert tensor_print(shards[0]) + tensor_print(shards[1]) == tensor_print(fused)
    padded = torch.cat([fused, torch.zeros(4, 4)])  # vLLM pads the vocabulary with zero rows
    assert tensor_print(padded).same_values(tensor_print(fused))
    assert tensor_print(torch.cat([k, k, k])) == tensor_print(k).times(3)  # a KV head repeated on 3 ranks


def test_the_check_passes_on_equal_weights_and_names_the_step_on_a_stale_one():
    sent = fingerprint(_weights(1).items())
    check_sync(dict(sent), sent, global_steps=1)
    held = fingerprint(_weights(0).items())
    with pytest.raises(StepCheckError) as err:
        check_sync(held, sent, global_steps=1)
    message = str(err.value)
    assert "\n" not in message
    assert re.match(
        r"weight sync check failed at step 2 \(the update after step 1\): rollout holds [0-9a-f]{12} but the "
        r"trainer sent [0-9a-f]{12} \(3 of 4 tensors differ, first: model\.embed_tokens\.weight\)$",
        message,
    ), message  # model.norm.weight is all ones in both: equal
    partial = {n: p for n, p in sent.items() if n != "model.norm.weight"}
    with pytest.raises(
        StepCheckError,
        match=r"at step 1 \(the initial sync\).*first: model\.norm\.weight \(not sent by the trainer\)\)$",
    ):
        check_sync(sent, partial, global_steps=0)


def test_ranks_merge_as_split_or_replicated_whichever_the_trainer_sent():
    full = torch.randn(8, 4)
    norm = torch.randn(4)
    sent = {"w": tensor_print(full), "norm": tensor_print(norm)}
    ranks = [{"w": tensor_print(half), "norm": tensor_print(norm)} for half in full.chunk(2)]
    assert merge_ranks(sent, ranks) == sent
    stale = [{"w": tensor_print(half), "norm": tensor_print(norm + 1)} for half in full.chunk(2)]
    assert merge_ranks(sent, stale)["norm"] != sent["norm"]
    grouped = group_sent(
        {"a.q_proj.w": TensorPrint("bfloat16", 2, 3, 5), "a.k_proj.w": TensorPrint("bfloat16", 1, 1, 1)},
        lambda name: name.replace("q_proj", "qkv_proj").replace("k_proj", "qkv_proj"),
    )
    assert grouped == {"a.qkv_proj.w": TensorPrint("bfloat16", 3, 4, 6)}


# ---- the hf engine -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from searchrl.trainer.cpu.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny"), ["hello world", "<tool_call>search</tool_call>"])


class _ServerHandle:
    """A Ray actor handle's `update_weights.remote(...)`, awaited in-process on the real server."""

    def __init__(self, server: HFGenerateServer) -> None:
        async def remote(*args: Any) -> Any:
            return server.update_weights(*args)

        self.update_weights = SimpleNamespace(remote=remote)


def _adapter(server: HFGenerateServer) -> HFServerAdapter:
    adapter = HFServerAdapter.__new__(HFServerAdapter)  # verl's BaseRollout init needs a worker's config
    adapter.is_leader_rank = True
    adapter._server = _ServerHandle(server)
    return adapter


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hf_adapter_passes_a_real_sync_in_the_servers_dtype(tiny_model_dir, dtype):
    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=8, dtype=dtype)
    adapter = _adapter(server)
    own = server.model.state_dict()
    noise = {
        t.data_ptr(): 0.01 * torch.randn_like(t.float()) for t in own.values()
    }  # a tied lm_head: one tensor
    trained = {name: t.float() + noise[t.data_ptr()] for name, t in own.items()}
    for step in (0, 1, 2):
        asyncio.run(adapter.update_weights(iter(trained.items()), global_steps=step))
        trained = {name: t + 0.01 for name, t in trained.items()}
    assert server.weight_updates == 3


def test_sabotage_stale_sync_stops_the_run_at_step_2_with_one_line(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(sabotage.ENV, sabotage.STALE_SYNC)
    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=8)
    adapter = _adapter(server)
    initial = {name: t.clone() for name, t in server.model.state_dict().items()}
    asyncio.run(
        adapter.update_weights(iter(initial.items()), global_steps=0)
    )  # the same weights: nothing to see
    trained = {name: t + 1e-3 for name, t in initial.items()}
    with pytest.raises(
        StepCheckError, match=r"^weight sync check failed at step 2 \(the update after step 1\)"
    ):
        asyncio.run(adapter.update_weights(iter(trained.items()), global_steps=1))


def test_a_server_that_loads_only_some_weights_is_caught(tiny_model_dir, monkeypatch):
    """A load that skips tensors silently (the old `strict=False` risk) differs in exactly those tensors."""
    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=8)
    adapter = _adapter(server)
    real_load = server.model.load_state_dict

    def skip_layer_1(state, strict=True):  # type: ignore[no-untyped-def]
        return real_load({n: t for n, t in state.items() if "layers.1." not in n}, strict=False)

    monkeypatch.setattr(server.model, "load_state_dict", skip_layer_1)
    trained = {name: t + 1e-3 for name, t in server.model.state_dict().items()}
    layer_1 = sum("layers.1." in name for name in trained)
    with pytest.raises(
        StepCheckError, match=rf"\({layer_1} of {len(trained)} tensors differ, first: model\.layers\.1\."
    ):
        asyncio.run(adapter.update_weights(iter(trained.items()), global_steps=4))
