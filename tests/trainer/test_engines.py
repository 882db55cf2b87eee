"""trainer/engines.py: the one engine table that settings, locks, overrides and the CPU runs' `--rollout` read."""

from __future__ import annotations

import argparse
from typing import get_args

import pytest

from searchrl.trainer import engines, lockfiles, overrides
from searchrl.trainer.proofs import train_cpu_vllm
from searchrl.trainer.settings import TrainSettings


def test_every_reader_takes_its_list_from_the_table():
    assert engines.GPU_ENGINES == ("vllm", "sglang") == get_args(engines.RolloutName)
    assert engines.CPU_ENGINES == ("vllm", "hf")
    assert lockfiles.ENGINES is engines.GPU_ENGINES
    assert overrides.SYNC_PLUGINS is engines.SYNC_PLUGINS and set(overrides.SYNC_PLUGINS) == set(
        engines.GPU_ENGINES
    )
    assert train_cpu_vllm.ROLLOUTS is engines.CPU_ENGINES
    # every GPU engine has a weight-sync check; the hf engine is never a GPU run's
    assert all(engines.ENGINES[name].sync_plugin for name in engines.GPU_ENGINES)
    assert "hf" not in engines.GPU_ENGINES


def test_settings_accept_the_gpu_engines_and_refuse_the_cpu_one():
    # sglang with a model it reads back (its Qwen2 cannot: trainer/weight_sync/sglang_readback.py)
    for name in engines.GPU_ENGINES:
        settings = TrainSettings(
            _env_file=None, rollout_name=name, model_name="meta-llama/Llama-3.2-1B-Instruct"
        )
        assert settings.rollout_name == name
    with pytest.raises(ValueError, match="rollout_name"):
        TrainSettings(_env_file=None, rollout_name="hf")


def test_the_cpu_cli_offers_the_tables_cpu_engines():
    from searchrl.cli import train_cpu

    parser = argparse.ArgumentParser()
    train_cpu.register(parser.add_subparsers())
    action = next(
        a
        for sub in parser._subparsers._group_actions
        for p in sub.choices.values()
        for a in p._actions  # type: ignore[union-attr]
        if a.dest == "rollout"
    )
    assert tuple(action.choices) == engines.CPU_ENGINES
