"""The hf engine as a standalone replica of verl's `separate_async` trainer (issue 40 item 3).

There verl builds our adapter inside its `CheckpointEngineWorker` (checkpoint_engine/base.py:340-349), in the
replica's own worker group (RANK 0 in every replica), passing `replica_rank`, and feeds it the checkpoint engine's
async generator of received weights. The unit tests pin each piece; the last runs verl's worker class itself,
receiving over the gloo engine (trainer/cpu/gloo_engine.py) from a second process into a real HFGenerateServer.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from searchrl.trainer.cpu.hf_rollout import HF_SERVER_NAME, HFGenerateServer
from tests.conftest import free_port
from tests.trainer.conftest import compose_verl

TIMEOUT_S = 180


def _configs(model_dir: Path, extra: list[str] = ()) -> tuple[Any, Any]:  # type: ignore[assignment]
    """verl's RolloutConfig and HFModelConfig as its workers receive them (composed, then converted)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    cfg = compose_verl(
        [
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            f"actor_rollout_ref.model.path={model_dir}",
            *extra,
        ]
    )
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    return rollout, model


class _Handle:
    """A Ray actor handle's `update_weights.remote(...)`, awaited in-process on the real server."""

    def __init__(self, server: HFGenerateServer) -> None:
        async def remote(*args: Any) -> Any:
            return server.update_weights(*args)

        self.update_weights = SimpleNamespace(remote=remote)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from searchrl.trainer.cpu.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny"), ["hello world", "<tool_call>search</tool_call>"])


@pytest.fixture(scope="module")
def configs(tiny_model_dir: Path) -> tuple[Any, Any]:
    import searchrl.trainer.cpu.plugin  # noqa: F401  (registers the hf adapter in verl's rollout registry)

    return _configs(tiny_model_dir)


def _adapter(configs: tuple[Any, Any], **kwargs: Any) -> Any:
    from verl.workers.rollout import get_rollout_class

    rollout, model = configs
    return get_rollout_class("hf", "async")(config=rollout, model_config=model, device_mesh=None, **kwargs)


@pytest.mark.parametrize(("rank", "kwargs", "replica"), [(0, {"replica_rank": 1}, 1), (1, {}, 1), (0, {}, 0)])
def test_the_adapter_addresses_the_replica_verl_names(configs, monkeypatch, rank, kwargs, replica) -> None:
    """Standalone: RANK is 0 in every replica's group and verl passes `replica_rank`; colocated: RANK // world."""
    import ray

    monkeypatch.setenv("RANK", str(rank))
    asked: list[str] = []
    monkeypatch.setattr(ray, "get_actor", lambda name: asked.append(name) or name)
    adapter = _adapter(configs, **kwargs)
    assert adapter._get_server() == HF_SERVER_NAME.format(rank=replica)
    assert (adapter.replica_rank, adapter.is_leader_rank) == (replica, True)


def test_the_adapter_loads_an_async_stream_of_weights(configs, tiny_model_dir, monkeypatch) -> None:
    """verl's standalone path hands `update_weights` the checkpoint engine's async generator (base.py:354-360)."""
    monkeypatch.setenv("RANK", "0")
    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=8)
    adapter = _adapter(configs, replica_rank=0)
    adapter._server = _Handle(server)
    trained = {name: t + 1e-3 for name, t in server.model.state_dict().items()}

    async def stream() -> Any:
        for item in trained.items():
            await asyncio.sleep(0)
            yield item

    asyncio.run(adapter.update_weights(stream(), global_steps=2))
    assert server.weight_updates == 1 and server.global_steps == 2
    held = server.model.state_dict()
    assert all(torch.equal(held[name], trained[name]) for name in trained)


class _Remote:
    """`ray.remote(cls).options(...).remote(**kwargs)`, building the real server in this process."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.built: list[Any] = []

    def options(self, **_kwargs: Any) -> _Remote:
        return self

    def remote(self, **kwargs: Any) -> Any:
        server = self.cls(**kwargs)
        self.built.append(server)

        async def ready() -> bool:
            return bool(server.ready())

        return SimpleNamespace(ready=SimpleNamespace(remote=ready))


@pytest.mark.parametrize(
    ("setting", "threads"), [(["+actor_rollout_ref.rollout.engine_kwargs.hf.threads=1"], 1), ([], None)]
)
def test_the_server_runs_on_the_threads_the_rollout_config_gives(
    tiny_model_dir, monkeypatch, setting, threads
) -> None:
    """separate_async: trainer and rollout compute at once, so the server must not take every core."""
    import ray

    from searchrl.trainer.cpu.hf_rollout import HFRolloutReplica

    made: list[_Remote] = []
    monkeypatch.setattr(ray, "remote", lambda cls: made.append(_Remote(cls)) or made[-1])
    rollout, model = _configs(tiny_model_dir, setting)
    before = torch.get_num_threads()
    try:
        asyncio.run(HFRolloutReplica(1, rollout, model, gpus_per_node=1).launch_servers())
        server = made[0].built[0]
        assert server.threads == (threads or len(os.sched_getaffinity(0)))
        assert torch.get_num_threads() == server.threads
    finally:
        torch.set_num_threads(before)


# ---- verl's CheckpointEngineWorker over gloo, two processes -----------------------------------------------------


def _trained(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(1)
    own = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    # one noise per storage: the tiny model ties lm_head to the embedding, which the server's check would catch
    noise = {t.data_ptr(): 0.01 * torch.randn(t.shape, generator=gen) for t in own.values()}
    return {name: t + noise[t.data_ptr()] for name, t in own.items()}


def _actor(model_dir: str, commands: Any, results: Any) -> None:
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine

    engine = GlooCheckpointEngine(bucket_size=1 << 20, is_master=True, timeout_s=60)
    results.put(engine.prepare())
    engine.init_process_group(**commands.get(timeout=TIMEOUT_S))
    results.put(asyncio.run(engine.send_weights(iter(_trained(model_dir).items()), global_steps=2)))
    engine.finalize()


def _rollout(model_dir: str, master_port: int, commands: Any, results: Any) -> None:
    # what a Ray worker of a CPU run has: the plugin imported at `import verl`, verl's worker environment
    os.environ.update(
        VERL_PLATFORM="cpu",
        VERL_USE_EXTERNAL_MODULES="searchrl.trainer.cpu.plugin",
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
    )
    import ray
    from verl.checkpoint_engine.base import CheckpointEngineWorker

    import searchrl.trainer.cpu.plugin  # noqa: F401  (verl was imported with this module, before the env was set)
    from searchrl.trainer.cpu.gloo_engine import engine_overrides
    from searchrl.trainer.weight_sync.fingerprint import digest, fingerprint

    server = HFGenerateServer(model_dir, prompt_length=8, response_length=8)
    asked: list[str] = []
    ray.get_actor = lambda name: asked.append(name) or _Handle(server)  # the replica's server actor
    rollout, model = _configs(Path(model_dir), [*engine_overrides(bucket_mb=1)])
    worker = CheckpointEngineWorker(rollout, model, replica_rank=1)  # as replica.py:234-239 builds it
    results.put(worker.execute_checkpoint_engine("prepare"))
    worker.execute_checkpoint_engine("init_process_group", **commands.get(timeout=TIMEOUT_S))
    asyncio.run(worker.update_weights(global_steps=2))
    worker.execute_checkpoint_engine("finalize")
    results.put(
        {
            "replica_rank": worker.get_replica_rank(),
            "leader": worker.is_leader_rank(),
            "asked": asked,
            "updates": server.weight_updates,
            "held": digest(fingerprint(server.model.state_dict().items())),
        }
    )


def _get(results: Any, procs: dict[str, Any]) -> Any:
    """The next result, or fail at once when a process died (instead of waiting out the timeout)."""
    import queue

    for _ in range(TIMEOUT_S):
        try:
            return results.get(timeout=1)
        except queue.Empty:
            dead = {role: p.exitcode for role, p in procs.items() if p.exitcode not in (None, 0)}
            assert not dead, f"process exited: {dead}"
    raise TimeoutError("no result")


@pytest.mark.slow  # ~30 s of CPU (two processes import verl, transformers and the model); 86 s wall on a busy 2-core Xeon
def test_verls_checkpoint_engine_worker_receives_over_gloo_into_the_hf_server(tiny_model_dir) -> None:
    from searchrl.trainer.cpu.gloo_engine import GlooCheckpointEngine
    from searchrl.trainer.weight_sync.fingerprint import digest, fingerprint

    ctx = mp.get_context("spawn")
    commands = {role: ctx.Queue() for role in ("actor", "rollout")}
    results = {role: ctx.Queue() for role in ("actor", "rollout")}
    procs = {
        "actor": ctx.Process(target=_actor, args=(str(tiny_model_dir), commands["actor"], results["actor"])),
        "rollout": ctx.Process(
            target=_rollout, args=(str(tiny_model_dir), free_port(), commands["rollout"], results["rollout"])
        ),
    }
    for p in procs.values():
        p.start()
    try:
        metadata = [_get(results[role], procs) for role in ("actor", "rollout")]
        actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, 1, metadata)
        commands["actor"].put({k: v[0] for k, v in actor_kwargs.items()})
        commands["rollout"].put({k: v[0] for k, v in rollout_kwargs.items()})
        sent = _get(results["actor"], procs)
        got = _get(results["rollout"], procs)
    finally:
        for p in procs.values():
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs.values()] == [0, 0]
    assert sent["checkpoint_engine/gloo_bytes"] > 0
    assert got["replica_rank"] == 1 and got["leader"] is True
    assert got["asked"] == [HF_SERVER_NAME.format(rank=1)]
    assert got["updates"] == 1
    trained = _trained(str(tiny_model_dir))
    assert got["held"] == digest(fingerprint(trained.items()))
