"""One gradient sync per mini batch on multi-node runs, counted in verl's own FSDP engine (issue 38 item 3).

Four gloo processes stand for two nodes of two GPUs each. Each builds verl 0.9.1's `FSDPEngine` mesh and FSDP module
with verl's own code (`_init_device_mesh`, `_build_fsdp_module` on the tiny Qwen2) from the actor's `fsdp_config` as
our rendered overrides compose it (`strategy=fsdp2`, FSDP2 over an HSDP mesh: tests/trainer/test_grad_accumulation.py
says why) and as verl's defaults have it (`strategy=fsdp`, FSDP1, one group), then runs one mini batch of K micro
batches through verl's own `forward_backward_batch` (its micro-batch loop and `_gradient_sync_context`). Only
`forward_step` is ours (a plain LM loss: the model call verl makes is not what is counted), and only the CPU
platform is a stand-in (trainer/cpu/plugin.py). The gradient collectives FSDP issues are counted by wrapping
torch.distributed's reduce-scatter and all-reduce in the workers: verl's defaults give one round per micro batch,
the overrides one per mini batch, and the gradients agree.
"""

from __future__ import annotations

import pytest

from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import free_port
from tests.trainer.conftest import gather_ranks

K = 4  # micro batches in the mini batch
WORLD = 4  # 2 nodes x 2 GPUs
ROWS = 2  # samples per micro batch


def _worker(rank: int, world: int, port: int, configs: dict, queue) -> None:  # pragma: no cover (subprocess)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from types import SimpleNamespace

    from torch.distributed.fsdp import _init_utils

    # verl builds FSDP1 with sync_module_states=True, which torch refuses for CPU parameters before it would
    # broadcast them (over gloo here, NCCL on the GPUs): on CPU that check alone is lifted.
    _init_utils._check_module_states_for_sync_module_states = lambda _states: None

    from tensordict import TensorDict
    from transformers import Qwen2ForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from searchrl.trainer.cpu.tiny_model import tiny_qwen2_config

    class _Engine(FSDPEngine):
        def forward_step(self, micro_batch, loss_function, forward_only):
            logits = self.module(input_ids=micro_batch["input_ids"]).logits
            return logits.float().logsumexp(-1).mean(), {"metrics": {}}

    counts = {"reduce_scatter": 0, "all_reduce": 0}
    originals = {name: getattr(dist, name) for name in ("reduce_scatter_single", "reduce_scatter_tensor")}

    def counting(name):
        def call(*args, **kwargs):
            counts["reduce_scatter"] += 1
            return originals[name](*args, **kwargs)

        return call

    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        if tensor.numel() > 1:  # gradients; verl's own token-count all-reduce is one number
            counts["all_reduce"] += 1
        return all_reduce(tensor, *args, **kwargs)

    results = {}
    for name, fsdp_config in configs.items():
        for micro_batches in (1, K):
            engine = object.__new__(_Engine)  # verl's methods on verl's config, without loading a Hub model
            engine.engine_config = fsdp_config
            engine.model_config = SimpleNamespace(lora_rank=0, enable_activation_offload=False)
            engine._init_device_mesh()  # verl's mesh from fsdp_config.fsdp_size
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(tiny_qwen2_config(64, max_position_embeddings=64))
            engine.module = engine._build_fsdp_module(model)
            torch.manual_seed(1 + rank)  # each rank its own data, as data parallelism has it
            ids = torch.randint(0, 64, (micro_batches * ROWS, 8))
            data = TensorDict({"input_ids": ids, "loss_mask": torch.ones_like(ids)}, batch_size=[len(ids)])
            tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=ROWS)
            counts.update(reduce_scatter=0, all_reduce=0)
            dist.reduce_scatter_single, dist.reduce_scatter_tensor = (
                counting("reduce_scatter_single"),
                counting("reduce_scatter_tensor"),
            )
            dist.all_reduce = counting_all_reduce
            try:
                engine.forward_backward_batch(data, loss_function=None)
            finally:
                dist.reduce_scatter_single = originals["reduce_scatter_single"]
                dist.reduce_scatter_tensor = originals["reduce_scatter_tensor"]
                dist.all_reduce = all_reduce
            # the mini batch's gradient norm: each rank's shard (fp32 after the sync), summed over the shard group
            shards = [p.grad for p in engine.module.parameters() if p.grad is not None]  # FSDP2: DTensors
            squares = sum(
                (g.to_local() if hasattr(g, "to_local") else g).float().pow(2).sum() for g in shards
            )
            mesh = engine.device_mesh
            dist.all_reduce(squares, group=mesh.get_group("fsdp") if mesh.ndim == 2 else None)
            norm = float(squares.sqrt())
            results[(name, micro_batches)] = (dict(counts), engine.device_mesh.ndim, norm)
    queue.put((rank, results))
    dist.destroy_process_group()


def _engine_config(compose, overrides: list[str]):
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(compose(overrides).actor_rollout_ref.actor).fsdp_config


@pytest.mark.slow
def test_multi_node_overrides_sync_gradients_once_per_mini_batch(compose, tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    from searchrl.trainer.cpu.plugin import ENV

    for key, value in ENV.items():  # the spawned workers import verl on the CPU platform
        monkeypatch.setenv(key, value)
    settings = TrainSettings(data_dir=tmp_path, nnodes=2, gpus_per_node=2, train_batch_size=8, rollout_n=4)
    ours = render_overrides(settings)
    configs = {
        "ours": _engine_config(compose, ours),
        "verl defaults": _engine_config(
            compose,
            [
                *ours,
                "actor_rollout_ref.actor.strategy=fsdp",
                "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
                "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=False",
            ],
        ),
    }
    assert configs["ours"].fsdp_size == 2 and configs["ours"].use_no_sync_for_gradient_accumulation is True
    assert (configs["ours"].strategy, configs["verl defaults"].strategy) == ("fsdp2", "fsdp")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(rank, WORLD, port, configs, queue)) for rank in range(WORLD)]
    for proc in procs:
        proc.start()
    results = gather_ranks(procs, queue, 300)
    for rank in range(WORLD):
        got = results[rank]
        old_one, old_mesh, old_norm = got[("verl defaults", 1)]
        old_k, _, old_k_norm = got[("verl defaults", K)]
        new_one, new_mesh, _ = got[("ours", 1)]
        new_k, _, new_k_norm = got[("ours", K)]
        # verl's defaults: one FSDP group over both "nodes", a reduce-scatter round after every micro batch
        assert old_mesh == 1 and old_one["reduce_scatter"] > 0 and old_one["all_reduce"] == 0
        assert old_k["reduce_scatter"] == K * old_one["reduce_scatter"]
        # ours: node-sized shard groups replicated across nodes (HSDP): a reduce-scatter inside the node and an
        # all-reduce of the shards across nodes, once for the whole mini batch, as for a mini batch of one
        assert new_mesh == 2 and new_one["reduce_scatter"] == new_one["all_reduce"] > 0
        assert new_k == new_one
        assert new_k_norm == pytest.approx(old_k_norm, rel=1e-4)  # the same gradient either way
