"""The `hf` engine under verl's async trainers: abort, park, resume, per-request budgets, version stamps, ledger.

In-process (no Ray) on the tiny model. The last test drives the server with verl's own
`FullyAsyncLLMServerClient`, the client `colocate_async` uses (verl/trainer/ppo/v1/trainer_colocate_async.py):
a turn aborted for a weight update and resumed on the new weights comes back as one output that spans two
versions and keeps within its budget.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

from searchrl.trainer.cpu import sabotage
from searchrl.trainer.cpu.hf_rollout import HFGenerateServer

SAMPLING = {"temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from searchrl.trainer.cpu.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny"), ["hello world", "<tool_call>search</tool_call>"])


def _server(model_dir: Any, response_length: int = 8, prompt_length: int = 16) -> HFGenerateServer:
    server = HFGenerateServer(str(model_dir), prompt_length, response_length, gather_s=0.01)
    server.stop_ids = (
        set()
    )  # random weights: no early stop token, so every turn runs to its budget or an abort
    server.tokenizer.eos_token_id = None
    return server


def _trained(server: HFGenerateServer, shift: float) -> dict[str, torch.Tensor]:
    return {name: t + shift for name, t in server.model.state_dict().items()}


async def _until(predicate: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _generating(server: HFGenerateServer) -> bool:
    return server._model_lock.locked()


def test_max_tokens_caps_a_turn_and_its_absence_keeps_the_room_rule(tiny_model_dir):
    server = _server(tiny_model_dir, response_length=8)

    async def turns():
        return await asyncio.gather(
            server.generate("a", [5, 6, 7], {**SAMPLING, "max_tokens": 3}),
            server.generate("b", [5, 6, 7], {**SAMPLING, "max_new_tokens": 2}),
            server.generate("c", [5, 6, 7], SAMPLING),
            server.generate("d", list(range(5, 25)), SAMPLING),  # 20 of 24: room for 4
        )

    outs = asyncio.run(turns())
    assert [len(o.token_ids) for o in outs] == [3, 2, 8, 4]
    assert all(len(o.log_probs) == len(o.token_ids) and o.stop_reason == "completed" for o in outs)


def test_abort_stops_the_running_batch_resolves_queued_turns_and_parks_new_ones_until_resume(tiny_model_dir):
    server = _server(tiny_model_dir, response_length=4000, prompt_length=16)
    server.max_batch = 2  # the third turn stays queued behind the running batch

    async def scenario():
        running = [asyncio.create_task(server.generate(str(i), [5, 6, 7], SAMPLING)) for i in range(3)]
        await _until(lambda: _generating(server) and len(server._pending) == 1)
        await server.abort_all_requests()
        outs = await asyncio.wait_for(asyncio.gather(*running), timeout=60)
        parked = asyncio.create_task(server.generate("late", [5, 6, 7], {**SAMPLING, "max_tokens": 2}))
        await asyncio.sleep(0.3)
        waited = not parked.done()
        await server.resume_generation()
        late = await asyncio.wait_for(parked, timeout=60)
        return outs, waited, late

    outs, waited, late = asyncio.run(scenario())
    cut, queued = outs[:2], outs[2]
    for out in cut:
        assert out.stop_reason == "aborted" and 1 <= len(out.token_ids) < 4000
        assert len(out.log_probs) == len(out.token_ids)
    assert queued.stop_reason == "aborted" and queued.token_ids == [] and queued.log_probs == []
    assert waited, "a turn sent while generation was paused ran before resume_generation"
    assert late.stop_reason == "completed" and len(late.token_ids) == 2


def test_reject_request_answers_aborted_at_once_while_paused(tiny_model_dir):
    server = _server(tiny_model_dir)

    async def scenario():
        await server.abort_all_requests(reject_request=True)
        out = await asyncio.wait_for(server.generate("x", [5, 6], SAMPLING), timeout=5)
        await server.resume_generation()
        again = await server.generate("y", [5, 6], {**SAMPLING, "max_tokens": 1})
        return out, again

    out, again = asyncio.run(scenario())
    assert out.stop_reason == "aborted" and out.token_ids == [] and out.extra_fields["global_steps"] == 0
    assert again.stop_reason == "completed" and len(again.token_ids) == 1


def test_a_batch_is_stamped_with_the_version_at_its_start_and_the_ledger_verifies_each_update(tiny_model_dir):
    """update_weights(global_steps=5) sent while a batch runs waits for it: that batch is stamped with the old
    version (its tokens came from the old weights), the next with 5. The stamp used to be read after the batch."""
    server = _server(tiny_model_dir, response_length=120, prompt_length=16)

    async def scenario():
        first = asyncio.create_task(server.generate("a", [5, 6, 7], SAMPLING))
        await _until(lambda: _generating(server))
        update = asyncio.create_task(asyncio.to_thread(server.update_weights, _trained(server, 0.25), 5))
        old = await first
        await update
        new = await server.generate("b", [5, 6, 7], {**SAMPLING, "max_tokens": 2})
        return old, new

    old, new = asyncio.run(scenario())
    assert old.extra_fields["global_steps"] == 0 and len(old.token_ids) == 120
    assert new.extra_fields["global_steps"] == 5
    ledger = server.ledger()
    assert list(ledger) == [5] and ledger[5]["held"] == ledger[5]["sent"]


def test_a_stale_server_leaves_an_unverified_ledger_entry(tiny_model_dir, monkeypatch):
    server = _server(tiny_model_dir)
    monkeypatch.setenv(sabotage.ENV, sabotage.STALE_SYNC)
    server.update_weights(_trained(server, 0.5), global_steps=1)
    assert server.ledger()[1]["held"] != server.ledger()[1]["sent"]


def test_sabotage_no_version_stamps_sends_turns_without_a_version(tiny_model_dir, monkeypatch):
    server = _server(tiny_model_dir)
    monkeypatch.setenv(sabotage.ENV, sabotage.NO_VERSION_STAMPS)
    out = asyncio.run(server.generate("a", [5, 6], {**SAMPLING, "max_tokens": 1}))
    assert out.extra_fields["global_steps"] is None


class _InProcessHandle:
    """What `_acquire_server` returns in verl: a handle whose `generate.remote(**kw)` is awaited (here, directly)."""

    def __init__(self, server: HFGenerateServer) -> None:
        self.generate = SimpleNamespace(remote=lambda **kw: server.generate(**kw))


def _client(server: HFGenerateServer, response_length: int) -> FullyAsyncLLMServerClient:
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "hf", "response_length": response_length}}}
    )
    balancer = SimpleNamespace(release_server=SimpleNamespace(remote=lambda **kw: None))
    client = FullyAsyncLLMServerClient(config, load_balancer_handle=balancer)
    client._lb_require_release_fields = []
    handle = _InProcessHandle(server)

    async def acquire(request_id: str, **extra: Any) -> tuple[str, Any]:
        return "hf-rollout-0", handle

    client._acquire_server = acquire  # type: ignore[method-assign]
    return client


def test_verls_async_client_resumes_an_aborted_turn_on_the_new_weights(tiny_model_dir):
    """colocate_async's sequence (on_sample_end: abort; on_step_end: update_weights then resume_generation) under
    verl's FullyAsyncLLMServerClient: the turn's tokens come from versions 0 and 1, in one output, within budget."""
    response_length = 200
    server = _server(tiny_model_dir, response_length=response_length, prompt_length=16)
    client = _client(server, response_length)

    async def scenario():
        turn = asyncio.create_task(client.generate("r", prompt_ids=[5, 6, 7], sampling_params=dict(SAMPLING)))
        await _until(lambda: _generating(server))
        await server.abort_all_requests()
        await _until(lambda: not _generating(server))
        await asyncio.to_thread(server.update_weights, _trained(server, 0.25), 1)
        await server.resume_generation()
        return await asyncio.wait_for(turn, timeout=120)

    out = asyncio.run(scenario())
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (0, 1)
    assert len(out.token_ids) == len(out.log_probs) == response_length  # the budget spans both attempts
    assert out.stop_reason == "length"
    assert server.stats()["batches"] == 2
