"""The gloo checkpoint engine (trainer/cpu/gloo_engine.py) moves weights between two processes the way verl drives it.

Two spawned processes stand in for actor rank 0 and one standalone rollout worker: each has its own default gloo
group first (as the FSDP actor and verl's rollout worker do), then the engine builds its standalone group beside
it. The parent plays verl's CheckpointEngineManager: `prepare` on both, `build_topology(1, 1, metadata)`,
`init_process_group` on both at once, then `send_weights` / `receive_weights`, then `finalize`.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
import torch

from searchrl.errors import StepCheckError
from tests.conftest import free_port

BUCKET = 4096  # bytes: "big.weight" (3000 fp32 = 12000 bytes) spans three buckets
TIMEOUT_S = 120


def _state(scale: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(16, 8, generator=gen) * scale,
        "big.weight": torch.randn(3000, generator=gen) * scale,
        "c.bias": (torch.randn(10, generator=gen) * scale).to(torch.bfloat16),
    }


def _corrupt(engine: Any) -> None:
    """Flip one byte of the first chunk of big.weight on its way from the wire into verl's merge."""
    original = engine._receive_chunks

    async def chunks() -> Any:
        async for meta, chunk in original():
            if meta.name == "big.weight" and meta.chunk_offset == 0:
                chunk = chunk.clone()
                chunk[7] ^= 0x40
            yield meta, chunk

    engine._receive_chunks = chunks


def _worker(role: str, default_port: int, commands: Any, results: Any) -> None:
    import torch.distributed as dist

    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine
    from searchrl.trainer.weight_sync.fingerprint import digest, fingerprint

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{default_port}", rank=0, world_size=1)
    engine = GlooCheckpointEngine(bucket_size=BUCKET, is_master=role == "actor", timeout_s=60)
    try:
        while True:
            command = commands.get(timeout=TIMEOUT_S)
            if command is None:
                break
            scale, corrupt = command
            results.put(("meta", role, engine.prepare()))
            engine.init_process_group(**commands.get(timeout=TIMEOUT_S))
            if role == "actor":
                state = _state(scale)
                metrics = asyncio.run(engine.send_weights(iter(state.items()), global_steps=3))
                results.put(("sent", digest(fingerprint(state.items())), metrics))
            else:
                if corrupt:
                    _corrupt(engine)

                async def collect() -> dict[str, torch.Tensor]:
                    return {n: t.clone() async for n, t in engine.receive_weights(global_steps=3)}

                try:
                    got = asyncio.run(collect())
                    results.put(("received", digest(fingerprint(got.items())), got))
                except StepCheckError as error:
                    results.put(("error", str(error), None))
            engine.finalize()
        # the default group is untouched by the engine's own group
        probe = torch.ones(1)
        dist.all_reduce(probe)
        results.put(("default_group", dist.get_world_size(), float(probe)))
    finally:
        dist.destroy_process_group()


def _get(results: Any, kind: str) -> tuple[Any, ...]:
    got = results.get(timeout=TIMEOUT_S)
    assert got[0] == kind or got[0] == "error", got
    return tuple(got)


def test_two_processes_sync_twice_and_a_corrupted_transfer_fails_with_one_line() -> None:
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine

    ctx = mp.get_context("spawn")
    commands = {role: ctx.Queue() for role in ("actor", "rollout")}
    results = {role: ctx.Queue() for role in ("actor", "rollout")}
    procs = {
        role: ctx.Process(target=_worker, args=(role, free_port(), commands[role], results[role]))
        for role in ("actor", "rollout")
    }
    for p in procs.values():
        p.start()
    try:
        outcomes = []
        for scale, corrupt in ((1.0, False), (2.0, False), (1.0, True)):
            for role in procs:
                commands[role].put((scale, corrupt))
            metadata = [_get(results["actor"], "meta")[2], _get(results["rollout"], "meta")[2]]
            actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, 1, metadata)
            assert actor_kwargs["rank"] == [0] and rollout_kwargs["rank"] == [1]
            commands["actor"].put({k: v[0] for k, v in actor_kwargs.items()})
            commands["rollout"].put({k: v[0] for k, v in rollout_kwargs.items()})
            outcomes.append((_get(results["actor"], "sent"), _get(results["rollout"], "received")))
        for role in procs:
            commands[role].put(None)
        defaults = [_get(results[role], "default_group") for role in procs]
    finally:
        for p in procs.values():
            p.join(TIMEOUT_S)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs.values()] == [0, 0]
    assert defaults == [("default_group", 1, 1.0)] * 2

    for (sent, received), scale in zip(outcomes[:2], (1.0, 2.0), strict=True):
        assert received[0] == "received", received[1]
        assert received[1] == sent[1]  # same digest on both sides
        expected = _state(scale)
        assert set(received[2]) == set(expected)
        for name, tensor in expected.items():
            assert received[2][name].dtype == tensor.dtype
            assert torch.equal(received[2][name], tensor), name
        assert sent[2]["checkpoint_engine/gloo_bytes"] == sum(t.nbytes for t in expected.values())
    assert outcomes[0][1][1] != outcomes[1][1][1]  # the second sync carried the new weights

    kind, message, _ = outcomes[2][1]
    assert kind == "error"
    assert "\n" not in message
    assert message.startswith(
        "gloo checkpoint engine: weights received for step 4 differ from what the trainer sent"
    )
    assert "first: big.weight" in message


def test_topology_has_one_sender_and_refuses_metadata_without_a_master() -> None:
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine

    master = {"host": "127.0.0.1", "port": 1234}
    actor, rollout = GlooCheckpointEngine.build_topology(3, 2, [{"master": master}, {}, {}, {}, {}])
    assert actor == {"rank": [0, -1, -1], "world_size": [3] * 3, "master_metadata": [master] * 3}
    assert rollout == {"rank": [1, 2], "world_size": [3] * 2, "master_metadata": [master] * 2}
    with pytest.raises(ValueError, match="actor rank 0 must be the master"):
        GlooCheckpointEngine.build_topology(1, 1, [{}, {}])


def test_an_actor_rank_outside_the_group_still_walks_the_weights() -> None:
    """Each item of verl's actor stream is a collective gather: a rank that skipped it would hang the others."""
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine

    engine = GlooCheckpointEngine(bucket_size=BUCKET)
    engine.init_process_group(rank=-1, world_size=2, master_metadata={"host": "127.0.0.1", "port": 1})
    walked = []

    def weights() -> Any:
        for name, tensor in _state(1.0).items():
            walked.append(name)
            yield name, tensor

    assert asyncio.run(engine.send_weights(weights())) == {}
    assert walked == ["a.weight", "big.weight", "c.bias"]


def test_verl_imports_our_module_and_builds_the_engine_from_its_own_config(compose: Any) -> None:
    """In a fresh interpreter (nothing of ours imported yet), verl's own config conversion accepts the keys we set,
    and the registry serves our class after `import_external_libs(custom_backend_module)`, with the constructor
    kwargs verl's actor worker (engine_workers.py:686) and rollout worker (checkpoint_engine/base.py:337) pass."""
    from omegaconf import OmegaConf

    from searchrl.trainer.cpu.gloo_engine import engine_overrides

    cfg = compose(
        [*engine_overrides(), "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=30"]
    )
    section = cfg.actor_rollout_ref.rollout.checkpoint_engine
    script = f"""
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.utils.import_utils import import_external_libs
conf = omega_conf_to_dataclass(OmegaConf.create({OmegaConf.to_container(section, resolve=True)!r}))
import sys
assert "searchrl.trainer.cpu.gloo_engine" not in sys.modules
import_external_libs(conf.custom_backend_module or None)
bucket = conf.update_weights_bucket_megabytes << 20
kwargs = conf.engine_kwargs.get(conf.backend, {{}})
actor = CheckpointEngineRegistry.new(conf.backend, is_master=True, bucket_size=bucket, **kwargs)
rollout = CheckpointEngineRegistry.new(conf.backend, bucket_size=bucket, **kwargs)
print(type(conf).__name__, type(actor).__module__, type(actor).__name__, actor.is_master, rollout.is_master,
      actor.bucket_size, actor.timeout.total_seconds())
"""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "CheckpointEngineConfig",
        "searchrl.trainer.cpu.gloo_engine",
        "GlooCheckpointEngine",
        "True",
        "False",
        str(64 << 20),
        "30.0",
    ]


def test_the_master_holds_its_published_port_from_prepare_on() -> None:
    """Two separate_async runs started together once lost a pick-then-bind race (EADDRINUSE at
    init_process_group): the port the master publishes is already its listening store's, so nobody can take it."""
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine

    engine = GlooCheckpointEngine(bucket_size=BUCKET, is_master=True, timeout_s=10)
    port = engine.prepare()["master"]["port"]
    with socket.socket() as other, pytest.raises(OSError, match="in use"):
        other.bind(("127.0.0.1", port))
    engine.finalize()
    assert GlooCheckpointEngine(bucket_size=BUCKET).prepare() == {}  # a receiver publishes nothing
