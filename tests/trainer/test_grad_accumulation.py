"""fp32 gradient accumulation with one sync per mini batch on multi-node runs, measured in verl's own FSDP engine
(issue 46 item 3).

Two gloo processes on CPU each build verl 0.9.1's whole `FSDPEngineWithLMHead` as its training worker does
(`EngineRegistry.new(...)` then `initialize()`: `_build_module`, `_build_fsdp_module` with verl's own
`MixedPrecision` (FSDP1) or `apply_fsdp2` + `MixedPrecisionPolicy` (FSDP2), bf16 parameters and fp32 reduction as
on the GPUs) from the actor's `fsdp_config` as our rendered overrides compose it, on the tiny Qwen2 of
trainer/cpu/tiny_model.py, and run one mini batch of K packed micro batches through verl's own
`forward_backward_batch` (its micro-batch loop, `_gradient_sync_context`, `forward_step` with bf16 autocast).
Only the loss is ours (weighted per-token log-probs summed over tokens) and only the CPU platform is a stand-in
(trainer/cpu/plugin.py). Before every micro batch after the first, the worker reads what FSDP holds as the unsynced
gradient (dtype, bytes); after the last it takes the synced gradient and the norm verl's `optimizer_step` clips by.
Runs, each one mini batch from the same weights and data: FSDP2 as rendered (no-sync), FSDP1 as rendered before
(`actor.strategy=fsdp`, no-sync), each also with a sync per micro batch
(`use_no_sync_for_gradient_accumulation=False`: every micro batch's gradient reduced in fp32 and accumulated in fp32
shards, the reference for the accumulation alone) and with fp32 parameters (an fp32 gradient, the reference for bf16
arithmetic as a whole), and FSDP2 no-sync on a 2-D (ddp, fsdp) HSDP mesh, whose checkpoint verl's merger then
merges.

What it shows (numbers in docs/training.md "Multi-node notes", "fp32 gradient accumulation"): FSDP1 under no-sync
holds the unsharded gradient in bf16, because torch's post-backward hook returns before the cast to the reduce dtype
(torch/distributed/fsdp/_runtime_utils.py:743-746 vs 757-764, torch 2.13), so the K micro batches are summed in bf16;
FSDP2 upcasts the first unsynced gradient to the reduce dtype and adds the later ones into it
(_fully_shard/_fsdp_param.py:802-820, _fsdp_param_group.py:603-612), so it holds fp32 and matches the
sync-per-micro-batch gradient to fp32 rounding.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import apply_clean_environ
from tests.trainer.conftest import gather_ranks
from tests.trainer.packed_engine import fsdp_engine

K = 8  # micro batches in the mini batch (a GPU run's mini batch has ~16 per GPU)
ROWS = 2  # samples per micro batch
WORLD = 2  # gloo ranks
VOCAB = 256
# CPU-only: verl compiles its entropy function by default (fsdp_config.use_torch_compile); nothing here needs it
CPU_OVERRIDES = ["actor_rollout_ref.actor.fsdp_config.use_torch_compile=False"]
NO_SYNC_KEY = "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation"
FSDP1 = "actor_rollout_ref.actor.strategy=fsdp"  # verl's default, what the overrides rendered before
FSDP2 = "actor_rollout_ref.actor.strategy=fsdp2"
FP32 = "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
HSDP_ON_TWO_RANKS = "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"  # mesh (ddp=2, fsdp=1)


def _held_gradients(module: Any) -> list[Any]:  # pragma: no cover (subprocess)
    """The unsynced gradients FSDP keeps between micro batches (none when it syncs after every micro batch).

    FSDP1 (flat parameters): a FlatParameter's `.grad` while it is still unsharded, larger than the parameter's
    local shard (after a sync `.grad` is the fp32 shard of the reduced gradient). FSDP2: each FSDPParam's
    `unsharded_accumulated_grad` (torch _fully_shard/_fsdp_param.py:181), plus any unsharded `.grad` not yet folded
    into it; the sharded DTensor parameters get a `.grad` only at the sync.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return [p.grad for p in module.parameters() if p.grad is not None and p.grad.numel() > p.numel()]
    held = []
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            for group in sub._get_fsdp_state()._fsdp_param_groups:
                for param in group.fsdp_params:
                    unsharded = getattr(param, "_unsharded_param", None)  # set at the first all-gather
                    held += [param.unsharded_accumulated_grad, getattr(unsharded, "grad", None)]
    return [g for g in held if g is not None]


def _synced_gradient(module: Any) -> Any:  # pragma: no cover (subprocess)
    """The mini batch's reduced gradient, flattened: FSDP2's whole gradient (DTensor.full_tensor, so 1-D and HSDP
    meshes compare), FSDP1's local flat shards (the same layout for every FSDP1 run on the same ranks)."""
    import torch

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.cat([(g.full_tensor() if hasattr(g, "full_tensor") else g).float().flatten() for g in grads])


def _batch(rank: int) -> Any:  # pragma: no cover (subprocess)
    """K x ROWS samples of varied lengths in verl's NO_PADDING layout, packed per micro batch."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as data parallelism has it
    lengths = torch.randint(6, 24, (K * ROWS,), generator=gen).tolist()

    def nested(tensors: list[Any]) -> Any:
        return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nested([torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]),
            "position_ids": nested([torch.arange(n) for n in lengths]),
            "loss_mask": nested([torch.cat([torch.ones(n - 1), torch.zeros(1)]) for n in lengths]),
            "weights": nested([torch.randn(n, generator=gen) for n in lengths]),
        },
        batch_size=[len(lengths)],
    )
    tu.assign_non_tensor(
        data,
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=ROWS,
        calculate_entropy=False,
        temperature=1.0,
        use_fused_kernels=False,
    )
    return data


def _loss(  # pragma: no cover (subprocess)
    model_output: dict[str, Any], data: Any, dp_group: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Weighted log-probs summed over tokens: every token reaches the gradient, and the mini batch's gradient is the
    sum of its micro batches' (no per-micro-batch mean to rescale)."""
    mask = data["loss_mask"].values()
    return (model_output["log_probs"].values() * data["weights"].values() * mask).sum(), {}


def _accumulate(
    engine: Any, rank: int, save_to: str | None
) -> dict[str, Any]:  # pragma: no cover (subprocess)
    """One mini batch through verl's `forward_backward_batch`, then verl's `optimizer_step` (its clip: FSDP1's
    `clip_grad_norm_`, FSDP2's `fsdp2_clip_grad_norm_` over DTensor shards, transformer_impl.py:805-815), inside
    `train_mode()` as verl's worker runs them (leaving it zeroes the gradients). Returns what FSDP held before each
    micro batch after the first (dtypes, bytes), the synced gradient and verl's gradient norm. Only `forward_step` is
    wrapped, to look before calling verl's. `save_to`: verl's FSDPCheckpointManager writes every rank's shard there
    before the step, so the checkpoint holds the source weights."""
    held_before: list[tuple[list[str], int]] = []
    verl_forward_step = engine.forward_step

    def forward_step(micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
        held = _held_gradients(engine.module)
        if held:
            dtypes = sorted({str(g.dtype) for g in held})
            held_before.append((dtypes, sum(g.numel() * g.element_size() for g in held)))
        return verl_forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)

    engine.forward_step = forward_step
    engine.optimizer_zero_grad()
    with engine.train_mode():
        engine.forward_backward_batch(_batch(rank), _loss)
        gradient = _synced_gradient(engine.module)
        if save_to is not None:
            engine.save_checkpoint(save_to, global_step=1)
        grad_norm = engine.optimizer_step()
    # numpy, pickled by value: a torch tensor would travel as a shared-memory handle that dies with the worker
    return {"held": held_before, "gradient": gradient.numpy(), "grad_norm": grad_norm}


def _worker(  # pragma: no cover (subprocess)
    rank: int, store: str, model_dir: str, configs: dict[str, Any], saves: dict[str, str], queue: Any
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=WORLD)
    from torch.distributed.fsdp import _init_utils

    # verl builds FSDP1 with sync_module_states=True, which torch refuses for CPU parameters before it would
    # broadcast them (over gloo here, NCCL on the GPUs): on CPU that check alone is lifted.
    _init_utils._check_module_states_for_sync_module_states = lambda _states: None

    results: dict[str, Any] = {}
    for name, engine_config in configs.items():
        engine = fsdp_engine(model_dir, engine_config)
        results[name] = {**_accumulate(engine, rank, saves.get(name)), "mesh": engine.device_mesh.ndim}
    queue.put((rank, results))
    dist.destroy_process_group()


def _engine_config(overrides: list[str]) -> Any:
    """The actor's FSDP engine config as verl's worker gets it (`actor_config.engine`, engine_workers.py:610):
    FSDPActorConfig.__post_init__ copies `actor.strategy` into it (workers/config/actor.py:318-325)."""
    from verl.utils.config import omega_conf_to_dataclass

    from tests.trainer.conftest import compose_verl

    return omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor).engine


def _difference(got: Any, ref: Any) -> dict[str, float]:
    """Max and mean |got - ref| over the whole gradient, relative to max and mean |ref|."""
    diff = (got - ref).abs()
    return {"max_rel": float(diff.max() / ref.abs().max()), "mean_rel": float(diff.mean() / ref.abs().mean())}


def two_node_settings(data_dir: Path) -> TrainSettings:
    """The default multi-node run: 2 nodes x 8 GPUs (sky/train.yaml)."""
    return TrainSettings(data_dir=data_dir, nnodes=2)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One mini batch per run. On 2 ranks the rendered fsdp_size (8) covers every rank, so verl builds a 1-D mesh
    (engine/fsdp/utils.py:47-48); `fsdp2 hsdp` sets fsdp_size=1 for its 2-D (ddp, fsdp) mesh, the HSDP layout of a
    multi-node run. fp32 runs set verl's mixed_precision to fp32 throughout (no autocast either)."""
    import torch
    import torch.multiprocessing as mp
    from transformers import Qwen2ForCausalLM

    from searchrl.trainer.cpu.plugin import ENV
    from searchrl.trainer.cpu.tiny_model import tiny_qwen2_config

    tmp = tmp_path_factory.mktemp("grad_accumulation")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config(VOCAB, hidden_size=64, attn_implementation="sdpa"))
    model.save_pretrained(tmp / "model")
    ours = [*render_overrides(two_node_settings(tmp)), *CPU_OVERRIDES]
    per_micro = f"{NO_SYNC_KEY}=False"
    configs = {
        "rendered": ours,  # exactly what the overrides say: FSDP2 with no-sync, or the test fails
        "fsdp2 per-micro-sync": [*ours, FSDP2, per_micro],
        "fsdp2 fp32 per-micro-sync": [*ours, FSDP2, per_micro, FP32],
        "fsdp2 hsdp no-sync": [*ours, FSDP2, HSDP_ON_TWO_RANKS],
        "fsdp1 no-sync": [*ours, FSDP1],
        "fsdp1 per-micro-sync": [*ours, FSDP1, per_micro],
        "fsdp1 fp32 per-micro-sync": [*ours, FSDP1, per_micro, FP32],
    }
    engine_configs = {name: _engine_config(overrides) for name, overrides in configs.items()}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    saves = {"fsdp2 hsdp no-sync": str(tmp / "run" / "global_step_1" / "actor")}
    args = ((tmp / "store").as_uri(), str(tmp / "model"), engine_configs, saves, queue)
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        # a module fixture starts before clean_env, and the plugin reads SEARCHRL_TEST_SABOTAGE at import
        apply_clean_environ(patch)
        for key, value in ENV.items():  # the spawned workers import verl on the CPU platform
            patch.setenv(key, value)
        procs = [ctx.Process(target=_worker, args=(rank, *args)) for rank in range(WORLD)]
        for proc in procs:
            proc.start()
    try:
        results = gather_ranks(procs, queue, 240)
    finally:
        for proc in procs:  # a rank left waiting in a collective for one that failed
            if proc.is_alive():
                proc.kill()
    runs: dict[str, Any] = {}
    for name in configs:
        # FSDP1: both ranks' flat shards in rank order; FSDP2: the whole gradient, the same on every rank
        parts = [torch.from_numpy(results[r][name]["gradient"]) for r in range(WORLD)]
        gradient = torch.cat(parts) if engine_configs[name].strategy == "fsdp" else parts[0]
        runs[name] = {**results[0][name], "gradient": gradient, "config": engine_configs[name]}
    return {
        "runs": runs,
        "source": model.state_dict(),
        "params": sum(p.numel() for p in model.parameters()),
        "checkpoint": Path(saves["fsdp2 hsdp no-sync"]),
        "seconds": time.monotonic() - started,
    }


def _vs(measured: dict[str, Any], name: str, reference: str) -> dict[str, float]:
    runs = measured["runs"]
    return _difference(runs[name]["gradient"], runs[reference]["gradient"])


@pytest.mark.slow
def test_multi_node_overrides_accumulate_gradients_in_fp32(measured: dict[str, Any]) -> None:
    """The default 2-node overrides build FSDP2 with no-sync, hold an fp32 gradient between micro batches, and
    their one sync gives the gradient of a sync per micro batch to fp32 rounding (also on an HSDP mesh)."""
    ours = measured["runs"]["rendered"]
    assert ours["config"].strategy == "fsdp2" and ours["config"].use_no_sync_for_gradient_accumulation is True
    for name in ("rendered", "fsdp2 hsdp no-sync"):
        held = measured["runs"][name]["held"]
        assert len(held) == K - 1, held  # held before every micro batch after the first
        assert all(dtypes == ["torch.float32"] for dtypes, _ in held), held
        # an unsharded fp32 copy of every parameter: 4 bytes a parameter on every rank (docs/training.md)
        assert held[-1][1] == 4 * measured["params"]
    assert measured["runs"]["fsdp2 per-micro-sync"]["held"] == []
    assert measured["runs"]["fsdp2 hsdp no-sync"]["mesh"] == 2 and ours["mesh"] == 1
    for name in ("rendered", "fsdp2 hsdp no-sync"):
        accumulation = _vs(measured, name, "fsdp2 per-micro-sync")
        assert accumulation["max_rel"] < 1e-5 and accumulation["mean_rel"] < 1e-6, (name, accumulation)


@pytest.mark.slow
def test_verls_gradient_norm_is_the_whole_gradients(measured: dict[str, Any]) -> None:
    """The norm verl clips by and logs (`optimizer_step`) is the whole mini batch gradient's, on either FSDP version
    and on the HSDP mesh, where FSDP2's shards are DTensors placed (Replicate, Shard)."""
    for name, run in measured["runs"].items():
        assert run["grad_norm"] == pytest.approx(float(run["gradient"].norm()), rel=1e-5), name


@pytest.mark.slow
def test_fsdp1_no_sync_accumulates_in_bf16(measured: dict[str, Any]) -> None:
    """What the overrides rendered before (`strategy=fsdp`): the control that shows the measurement sees bf16
    accumulation, and the size of its error next to bf16 arithmetic's own."""
    held = measured["runs"]["fsdp1 no-sync"]["held"]
    assert len(held) == K - 1 and all(dtypes == ["torch.bfloat16"] for dtypes, _ in held), held
    assert held[-1][1] == 2 * measured["params"]  # unsharded, 2 bytes a parameter
    assert measured["runs"]["fsdp1 per-micro-sync"]["held"] == []
    before = _vs(measured, "fsdp1 no-sync", "fsdp1 per-micro-sync")
    after = _vs(measured, "fsdp2 hsdp no-sync", "fsdp2 per-micro-sync")
    # bf16 partial sums: errors of the order of bf16's 2^-8 spacing, orders of magnitude above FSDP2's
    assert before["mean_rel"] > 1e-4 and before["mean_rel"] > 1000 * after["mean_rel"], (before, after)
    # against an fp32 gradient (fp32 parameters, no autocast) the bf16 accumulation adds to bf16 arithmetic's error
    total_before = _vs(measured, "fsdp1 no-sync", "fsdp1 fp32 per-micro-sync")
    total_after = _vs(measured, "fsdp2 hsdp no-sync", "fsdp2 fp32 per-micro-sync")
    assert total_before["mean_rel"] > total_after["mean_rel"], (total_before, total_after)


@pytest.mark.slow
def test_fsdp2_hsdp_checkpoint_merges_with_verls_merger(measured: dict[str, Any], tmp_path: Path) -> None:
    """An FSDP2 checkpoint on the 2-D (ddp, fsdp) mesh, saved by verl's FSDPCheckpointManager from the engine above,
    merges with `python -m verl.model_merger merge --backend fsdp` (run in-process here: its own `main()`), which
    is what trainer/merge.py runs; no update was taken, so the merge equals the source model (in bf16, as verl's
    merger writes it)."""
    import json
    import sys

    import torch
    from transformers import AutoModelForCausalLM
    from verl.model_merger.__main__ import main as merger_main

    actor = measured["checkpoint"]
    assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": WORLD}
    argv = ["verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [*argv, str(tmp_path / "merged")])
        merger_main()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.bfloat16).state_dict()
    source = measured["source"]
    assert set(merged) == set(source)
    for key, value in source.items():
        assert torch.equal(merged[key], value.to(torch.bfloat16)), key
