"""Checkpoint merge: a tiny FSDP checkpoint written by verl's own checkpoint manager (gloo, CPU, world size 1),
merged by `python -m verl.model_merger` through trainer/merge.py, must equal the source model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.errors import CheckpointError
from searchrl.trainer.merge import (
    TRACKER_FILE,
    find_latest_checkpoint,
    merge_latest,
    run_verl_merger,
    verify_hf_model,
)
from tests.live import free_port


def _tiny_qwen2(seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=2048,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        architectures=["Qwen2ForCausalLM"],  # set by from_pretrained in real runs; the merger reads it
    )
    return Qwen2ForCausalLM(config)


def _shard(model, version: int):
    """Wrap like verl's `strategy=fsdp` (FSDP1; NO_SHARD at world size 1, plain tensors) or `fsdp2`
    (fully_shard; DTensor shards), so both of the merger's paths run."""
    import torch

    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=torch.device("cpu"))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _write_fsdp_checkpoints(
    run_dir: Path, tokenizer, steps_and_seeds: list[tuple[int, int]], version: int
) -> dict[int, dict]:
    """Save each step with verl's FSDPCheckpointManager; return the source state dicts by step."""
    import torch.distributed as dist
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    sources = {}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for step, seed in steps_and_seeds:
            model = _tiny_qwen2(seed)
            sources[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            fsdp = _shard(model, version)
            manager = FSDPCheckpointManager(
                model=fsdp,
                optimizer=None,
                processing_class=tokenizer,
                checkpoint_config={"save_contents": ["model"], "load_contents": ["model"]},
            )
            manager.save_checkpoint(str(run_dir / f"global_step_{step}" / "actor"), global_step=step)
    finally:
        dist.destroy_process_group()
    return sources


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2], ids=["fsdp1", "fsdp2"])
def test_merge_latest_equals_source_model(tmp_path, offline_tokenizer, version):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tmp_path / "run"
    sources = _write_fsdp_checkpoints(run_dir, offline_tokenizer, [(2, 0), (5, 1)], version)
    fsdp_config = json.loads((run_dir / "global_step_5" / "actor" / "fsdp_config.json").read_text())
    assert fsdp_config == {"FSDP_version": version, "world_size": 1}
    (run_dir / TRACKER_FILE).write_text("5")
    (run_dir / "global_step_7" / "actor").mkdir(parents=True)  # a half-written newer step is ignored

    result = merge_latest(run_dir)
    assert result.step == 5 and result.target_dir == (run_dir / "merged" / "global_step_5").resolve()
    assert result.num_parameters == sum(v.numel() for v in sources[5].values())

    merged = AutoModelForCausalLM.from_pretrained(result.target_dir, dtype=torch.bfloat16).state_dict()
    assert set(merged) == set(sources[5])
    for key, value in sources[5].items():
        # verl's merger writes bfloat16: the merged weights equal the source weights in bfloat16, bit for bit.
        assert torch.equal(merged[key], value.to(torch.bfloat16)), key
    assert not torch.equal(merged["lm_head.weight"], sources[2]["lm_head.weight"].to(torch.bfloat16))
    tok = AutoTokenizer.from_pretrained(result.target_dir)
    assert tok.encode("The Seventh Seal") == offline_tokenizer.encode("The Seventh Seal")


def test_missing_tracker_names_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="no latest_checkpointed_iteration.txt"):
        find_latest_checkpoint(tmp_path)


def test_tracker_pointing_at_a_missing_step(tmp_path):
    (tmp_path / TRACKER_FILE).write_text("3\n")
    with pytest.raises(CheckpointError, match="step 3"):
        find_latest_checkpoint(tmp_path)
    (tmp_path / TRACKER_FILE).write_text("three")
    with pytest.raises(CheckpointError, match="not a step number"):
        find_latest_checkpoint(tmp_path)


def test_tracker_found(tmp_path):
    actor = tmp_path / "global_step_12" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text('{"FSDP_version": 1, "world_size": 1}')
    (tmp_path / TRACKER_FILE).write_text("12")
    assert find_latest_checkpoint(tmp_path) == (12, actor)


def test_merger_exit_code_becomes_a_checkpoint_error(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\nexit 3\n")
    fake_python.chmod(0o755)
    with pytest.raises(CheckpointError, match="exit code 3"):
        run_verl_merger(tmp_path / "actor", tmp_path / "out", python=str(fake_python))


def test_unloadable_output_is_a_checkpoint_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="does not load"):
        verify_hf_model(tmp_path)
