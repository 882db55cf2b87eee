"""trainer/step_cost.py: its micro batches are verl's own, and the plan's figures for the default 2-node run.

The plan runs in SkyPilot's venv, which has neither torch nor verl, so trainer/step_cost.py restates verl 0.9.1's
`prepare_micro_batches` in plain Python. These tests run verl's own function (dev venv) on the same lengths and
require the same micro batches: a verl upgrade that changes them fails here, not in a GPU bill.
"""

from __future__ import annotations

import random

import pytest

from searchrl.trainer import step_cost
from searchrl.trainer.settings import TrainSettings


def _verl_micro_batches(
    lengths: list[int], *, budget: int | None = None, rows: int | None = None
) -> list[list[int]]:
    """verl's prepare_micro_batches on one GPU's samples (nested input_ids, as verl's NO_PADDING batches hold)."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    ids = torch.nested.as_nested_tensor(
        [torch.ones(n, dtype=torch.long) for n in lengths], layout=torch.jagged
    )
    data = TensorDict({"input_ids": ids}, batch_size=[len(lengths)])
    if budget is not None:
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=budget)
    else:
        tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=rows)
    batches, _ = prepare_micro_batches(data)
    return [[int(n) for n in mb["input_ids"].offsets().diff()] for mb in batches]


def _default_lengths(count: int, seed: int = 0) -> list[int]:
    """The lengths the cost model samples for a default run (the shape does not change them)."""
    x = step_cost._inputs(TrainSettings(_env_file=None), step_cost.MODEL_SHAPES["qwen2.5-3b"])
    return x.lengths(count, seed)


def _cases() -> list[tuple[str, list[int], int]]:
    rng = random.Random(7)
    return [
        ("2 nodes: update share", _default_lengths(80), 10_240),
        ("2 nodes: log-prob share", _default_lengths(160, seed=1), 10_240),
        ("1 node: update share", _default_lengths(160), 10_240),
        ("uniform lengths", [rng.randint(200, 5_120) for _ in range(96)], 10_240),
        # near-budget samples: the first Karmarkar-Karp split overflows and verl adds micro batches
        ("near the budget", [rng.choice([5_000, 5_120, 4_900, 300]) for _ in range(40)], 10_240),
        ("ties", [1_000] * 33 + [2_000] * 7, 4_096),
    ]


@pytest.mark.parametrize(("name", "lengths", "budget"), _cases(), ids=[c[0] for c in _cases()])
def test_dynamic_micro_batches_are_verls(name: str, lengths: list[int], budget: int) -> None:
    ours = step_cost.dynamic_micro_batches(lengths, budget)
    verls = _verl_micro_batches(lengths, budget=budget)
    assert sorted(map(sorted, ours)) == sorted(map(sorted, verls))  # same micro batches, same samples in each
    assert all(sum(mb) <= budget for mb in ours)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_fixed_micro_batches_are_verls(rows: int) -> None:
    lengths = _default_lengths(80)
    assert step_cost.fixed_micro_batches(lengths, rows) == _verl_micro_batches(lengths, rows=rows)


def test_the_plan_for_two_nodes_packs_shards_inside_a_node_and_counts_the_cross_node_bytes() -> None:
    """The figures `make train DRY_RUN=1 NODES=2` prints for the default recipe (Qwen2.5-3B, 512 x 5, 1,024 +
    4,096 tokens, 2 x 8 GPUs)."""
    s = TrainSettings(_env_file=None, nnodes=2, gpus_per_node=8)
    assert s.removes_padding is True and s.fsdp_size == 8 and s.sync_grads_per_mini_batch is True
    packed, padded = step_cost.step_cost(s, True), step_cost.step_cost(s, False)
    assert packed is not None and padded is not None
    # padded: 1,280 samples a mini batch / 16 GPUs = 80 rows a GPU in 2-row micro batches; 2,560 / 16 for log-probs
    assert [(p.name, p.micro_batches, p.calls) for p in padded.phases] == [
        ("update", 40, 2), ("old log-prob", 80, 1), ("reference", 80, 1)
    ]  # fmt: skip
    assert 0.15 < padded.phases[0].padded_share < 0.3
    update, old_lp, ref = packed.phases
    assert 12 <= update.micro_batches <= 20 and 23 <= old_lp.micro_batches <= 39  # the 12-20 / 23-39
    assert update.padded_share == 0
    # ESTIMATE: one fp32 gradient all-reduce of each node's shards per mini batch, 2 mini batches:
    # 2 x 2(r-1)/r x 4 bytes x 3,085,938,688 params with r = 2 replicas = 24.7 GB a node
    assert packed.cross_node_bytes == pytest.approx(2 * 4 * 3_085_938_688)
    assert packed.fsdp_group == 8 and packed.grad_syncs_per_mini_batch == 1
    lines = step_cost.plan_lines(s)
    assert lines[0].startswith("micro batches: packed")
    assert "FSDP group: 8 GPUs (inside each node); gradient sync: once per mini batch" in lines[1]
    assert f"update {update.micro_batches} x 2 mini batches" in lines[2]
    assert "cross-node 24.7 GB per node" in lines[3] and "ESTIMATE" in lines[3]


def test_verls_defaults_on_two_nodes_cross_the_node_link_per_micro_batch() -> None:
    """Before: fsdp_size -1 (one group of 16) and a reduce-scatter per micro batch. Every collective crosses the
    node link: per micro batch of the update 2 bf16 all-gathers (2P each) and an fp32 reduce-scatter (4P), per
    log-prob micro batch one all-gather, one more for the weight export, each x 15/16 (ring over 16)."""
    s = TrainSettings(_env_file=None, nnodes=2, gpus_per_node=8, remove_padding="off")
    x = step_cost._inputs(s, step_cost.MODEL_SHAPES["qwen2.5-3b"])
    before = step_cost._step_cost(
        step_cost._Inputs(**{**x.__dict__, "fsdp_size": -1, "no_sync": False}), packed=False
    )
    p = 3_085_938_688
    gathers = 2 * 40 * 2 + 80 + 80 + 1
    assert before.fsdp_group == 16
    assert before.cross_node_bytes == pytest.approx((gathers * 2 * p + 2 * 40 * 4 * p) * 15 / 16)
    assert before.cross_node_bytes > 2.5e12  # ~2.8 TB a node a step, against 24.7 GB with the overrides


def test_the_one_node_rehearsal_keeps_the_replica_all_reduce_inside_the_node() -> None:
    """REHEARSE_MULTI_NODE=1 on 1 x 8: HSDP 2 x 4 with one sync per mini batch, as on 2 nodes, but the replicas'
    all-reduce runs over NVLink: no cross-node bytes. Each GPU all-reduces its fp32 shard (4P / 4) with the other
    replica, 2 (r-1)/r = 1 times its size, once per mini batch, 2 mini batches."""
    s = TrainSettings(_env_file=None, rehearse_multi_node=True)
    x = step_cost._inputs(s, step_cost.MODEL_SHAPES["qwen2.5-3b"])
    rehearsal = step_cost._step_cost(x, packed=True)
    assert (rehearsal.fsdp_group, rehearsal.grad_syncs_per_mini_batch) == (4, 1)
    assert rehearsal.cross_node_bytes == 0.0
    no_replicas = step_cost._step_cost(step_cost._Inputs(**{**x.__dict__, "fsdp_size": 8}), packed=True)
    p, nvlink = 3_085_938_688, step_cost.HARDWARE.nvlink_bytes_s
    update, *log_probs = rehearsal.phases
    gathers = 2 * update.micro_batches * 2 + sum(ph.micro_batches for ph in log_probs) + 1
    # all-gathers of bf16 parameters, one fp32 reduce-scatter per mini batch
    fsdp_bytes = gathers * 2 * p + 2 * 4 * p
    # the same collectives over a ring of 4 instead of 8, plus the replicas' all-reduce of each GPU's shard
    assert rehearsal.intra_node_s == pytest.approx((fsdp_bytes * 3 / 4 + 2 * 4 * p / 4) / nvlink)
    assert no_replicas.intra_node_s == pytest.approx(fsdp_bytes * 7 / 8 / nvlink)
    lines = step_cost.plan_lines(s)
    assert lines[0] == (
        "rehearsal of the multi-node trainer on one node: FSDP2, no-sync, HSDP 2 x 4 (fsdp_size 4)"
    )
    assert lines[2] == (
        "FSDP group: 4 GPUs (HSDP 2 x 4 inside the node, as on 2 nodes); gradient sync: once per mini batch"
    )
    assert not any("rehearsal" in line for line in step_cost.plan_lines(TrainSettings(_env_file=None)))


def test_unknown_model_keeps_verls_padded_default_and_says_so() -> None:
    s = TrainSettings(_env_file=None, model_name="/models/my-tiny-model", nnodes=2, flash_attn=False)
    assert s.removes_padding is False
    assert "unknown model shape" in step_cost.choose_packing(s).reason
    assert any("not estimated" in line for line in step_cost.plan_lines(s))
