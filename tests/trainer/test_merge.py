"""Checkpoint merge: a tiny FSDP checkpoint written by verl's own checkpoint manager (gloo, CPU, world size 1),
merged by `python -m verl.model_merger` through trainer/merge.py, must equal the source model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
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
from tests.conftest import free_port


def _tiny_qwen2(seed: int):
    import torch
    from transformers import Qwen2ForCausalLM

    from searchrl.trainer.cpu.tiny_model import tiny_qwen2_config

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_qwen2_config(2048, max_position_embeddings=256, tie_word_embeddings=False))


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


# --- files that reach this node late (issue 34 item 1) -----------------------------------------------------------
# On a multi-node run verl's rank 0 (placed by sorting node IPs as strings, not necessarily on the head) writes
# fsdp_config.json and huggingface/, and each node's rclone uploads its own files on its own schedule: the head,
# where merge runs, sees them seconds to minutes after the tracker. A thread plays those uploads here.


def _shards(actor: Path, world: int = 2) -> None:
    import torch

    actor.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        torch.save({"w": torch.full((8, 8), float(rank))}, actor / f"model_world_size_{world}_rank_{rank}.pt")


def _rank0_files(actor: Path, world: int = 2) -> None:
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    (actor / "huggingface" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))


def _later(*steps: tuple[float, Callable[[], object]]) -> threading.Thread:
    """Run each (delay after the previous one, action) in a thread: the other nodes' uploads arriving."""

    def play() -> None:
        for delay, action in steps:
            time.sleep(delay)
            action()

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Polls every 0.2 s and a 1 s tracker settle (15 s and 30 s on a node); the merger records its input."""
    from searchrl.trainer import checkpoint, merge

    monkeypatch.setattr(checkpoint, "POLL_INTERVAL_S", 0.2, raising=False)
    monkeypatch.setattr(checkpoint, "TRACKER_SETTLE_S", 1.0, raising=False)
    merged: list[Path] = []

    def fake_merger(actor_dir: Path, target_dir: Path, python: str = "") -> None:
        merged.append(actor_dir)
        target_dir.mkdir(parents=True)

    monkeypatch.setattr(merge, "run_verl_merger", fake_merger)
    return merged


def test_merge_waits_for_a_step_whose_files_are_not_there_yet(tmp_path: Path, fast_polls: list[Path]) -> None:
    """The issue's case: the tracker names step 2, its actor folder is still empty. The old code exited 2 at once."""
    from searchrl.cli import main

    run = tmp_path / "run"
    actor = run / "global_step_2" / "actor"
    actor.mkdir(parents=True)
    (run / TRACKER_FILE).write_text("2")
    uploads = _later((0.5, lambda: _shards(actor)), (0.5, lambda: _rank0_files(actor)))
    started = time.monotonic()
    rc = main(["train", "merge", "--run-dir", str(run), "--wait", "20", "--no-verify"])
    uploads.join()
    assert rc == 0 and fast_polls == [actor.resolve()]
    assert 1.0 <= time.monotonic() - started < 10


def test_merge_trusts_the_tracker_only_after_re_reading_it(tmp_path: Path, fast_polls: list[Path]) -> None:
    """A stale tracker (the previous save's step, complete) is replaced while it is re-read: the newest step is
    merged, not the one read first. Also: no tracker at all yet is "not yet", and huggingface/ comes last."""
    from searchrl.cli import main

    run = tmp_path / "run"
    old, new = run / "global_step_1" / "actor", run / "global_step_2" / "actor"
    _shards(old)
    _rank0_files(old)

    def step_two() -> None:
        _shards(new)
        (new / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
        (run / TRACKER_FILE).write_text("2")

    uploads = _later(
        (0.4, lambda: (run / TRACKER_FILE).write_text("1")),  # no tracker for the first polls
        (0.4, step_two),  # within the settle window
        (0.6, lambda: _rank0_files(new)),  # huggingface/config.json arrives last
    )
    rc = main(["train", "merge", "--run-dir", str(run), "--wait", "20", "--no-verify"])
    uploads.join()
    assert rc == 0 and fast_polls == [new.resolve()]


def test_merge_honours_wait_then_names_what_never_came(
    tmp_path: Path, fast_polls: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from searchrl.cli import main

    run = tmp_path / "run"
    actor = run / "global_step_2" / "actor"
    _shards(actor)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    (run / TRACKER_FILE).write_text("2")
    started = time.monotonic()
    rc = main(["train", "merge", "--run-dir", str(run), "--wait", "2", "--no-verify"])
    waited = time.monotonic() - started
    assert rc == 2 and not fast_polls
    assert 2.0 <= waited < 4.0  # the whole --wait, not one poll, and not much more
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]  # logs aside
    assert line.startswith("error: checkpoint ") and "incomplete after 2s" in line
    assert "huggingface/config.json missing" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    started = time.monotonic()
    assert main(["train", "merge", "--run-dir", str(empty), "--wait", "1", "--no-verify"]) == 2
    assert time.monotonic() - started >= 1.0
    assert "no latest_checkpointed_iteration.txt" in capsys.readouterr().err


@pytest.mark.slow
def test_verl_checkpoint_uploaded_out_of_order_still_merges(
    tmp_path: Path, offline_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint written by verl's own FSDPCheckpointManager reaches the run folder file by file, tracker first
    and rank 0's files last; merge_latest waits and verl's merger then merges it."""
    import shutil

    from searchrl.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "POLL_INTERVAL_S", 0.2)
    monkeypatch.setattr(checkpoint, "TRACKER_SETTLE_S", 0.5)
    staged = tmp_path / "written"
    sources = _write_fsdp_checkpoints(staged, offline_tokenizer, [(3, 0)], version=2)
    src, run = staged / "global_step_3" / "actor", tmp_path / "run"
    dst = run / "global_step_3" / "actor"
    dst.mkdir(parents=True)
    (run / TRACKER_FILE).write_text("3")
    shards = [p for p in src.glob("*.pt")]
    uploads = _later(
        *[(0.3, lambda p=p: shutil.copy(p, dst / p.name)) for p in shards],
        (0.3, lambda: shutil.copytree(src / "huggingface", dst / "huggingface")),
        (0.3, lambda: shutil.copy(src / "fsdp_config.json", dst / "fsdp_config.json")),
    )
    result = merge_latest(run, wait_s=60)
    uploads.join()
    assert result.step == 3 and result.num_parameters == sum(v.numel() for v in sources[3].values())
