"""Sizing arithmetic: queries per step from the GRPO recipe, replicas, dollars per million queries."""

from __future__ import annotations

import pytest

from searchrl.bench.sizing import PRICES, Price, TrainerLoad, replicas_needed, sizing_table, usd_per_million


def test_queries_per_step_follow_the_recipe() -> None:
    load = TrainerLoad(gpus=8)  # Search-R1: batch 512, n=5, up to 4 searches each
    assert load.queries_per_step == 512 * 5 * 4 == 10_240
    assert load.peak_qps == pytest.approx(10_240 / 60.0)
    assert TrainerLoad(gpus=64).rollout_seconds == pytest.approx(60.0 / 8)  # 8x the GPUs, 1/8 the time


def test_replicas_round_up_with_headroom() -> None:
    load = TrainerLoad(gpus=8, rollout_seconds_8gpu=100.0)  # 102.4 q/s peak
    assert replicas_needed(load, 200.0) == 1
    assert replicas_needed(load, 100.0) == 2  # 100 x 0.7 = 70 < 102.4
    assert replicas_needed(load, 100.0, headroom=1.0) == 2
    assert replicas_needed(load, 103.0, headroom=1.0) == 1
    with pytest.raises(ValueError):
        replicas_needed(load, 0.0)


def test_dollars_per_million_queries() -> None:
    price = Price("x", 2, 0.36, "test")
    assert usd_per_million(100.0, price) == pytest.approx(0.36 / 360_000 * 1e6)  # $1.00
    assert PRICES["c7a.large"].source and PRICES["c7a.4xlarge"].vcpus == 16


def test_table_scales_per_core_throughput_to_the_replica() -> None:
    rows = sizing_table({"minilm": 300.0}, cores=2, price=PRICES["c7a.4xlarge"], gpus=(8, 64))
    assert [r["gpus"] for r in rows] == [8, 64]
    assert rows[0]["qps_per_core"] == 150.0 and rows[0]["replica_qps"] == 2400.0
    assert rows[1]["replicas"] >= rows[0]["replicas"]
