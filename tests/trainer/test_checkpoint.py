"""trainer/checkpoint.py: every rank's shard present and whole before merge or resume, waited for, or refused.

The shards are real `torch.save` archives named as verl's FSDPCheckpointManager names them
(`<kind>_world_size_W_rank_R.pt`, plus rank 0's `fsdp_config.json`), for a 2-node x 2-GPU world of 4 ranks:
ranks 2 and 3 are the worker's, whose upload may lag the head's tracker file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.errors import CheckpointError
from searchrl.trainer.checkpoint import (
    TRACKER_FILE,
    check_resume,
    inspect_checkpoint,
    shard_problem,
    wait_for_checkpoint,
)
from searchrl.trainer.launch import prepare_launch
from searchrl.trainer.settings import TrainSettings
from tests.conftest import REPO

WORLD = 4
KINDS = ("model", "optim", "extra_state")


def write_checkpoint(run_dir: Path, step: int, *, world_size: int = WORLD, tracker: bool = True) -> Path:
    import torch

    actor = run_dir / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    for kind in KINDS:
        for rank in range(world_size):
            torch.save(
                {"w": torch.full((64, 64), float(rank))},
                actor / f"{kind}_world_size_{world_size}_rank_{rank}.pt",
            )
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    if tracker:
        (run_dir / TRACKER_FILE).write_text(str(step))
    return actor


def cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_complete_checkpoint_lists_every_ranks_shard_with_its_size(tmp_path: Path) -> None:
    actor = write_checkpoint(tmp_path, 10)
    state = inspect_checkpoint(actor)
    assert state.complete and state.world_size == WORLD
    assert sorted((s.kind, s.rank) for s in state.shards) == sorted(
        (k, r) for k in KINDS for r in range(WORLD)
    )
    assert all(s.size == s.path.stat().st_size > 1000 for s in state.shards)
    assert wait_for_checkpoint(actor, deadline_s=0).complete


def test_missing_and_short_worker_shards_are_named(tmp_path: Path) -> None:
    actor = write_checkpoint(tmp_path, 10)
    (actor / "optim_world_size_4_rank_3.pt").unlink()
    cut_short(actor / "model_world_size_4_rank_2.pt")
    assert shard_problem(actor / "model_world_size_4_rank_2.pt").startswith("short (")  # type: ignore[union-attr]
    state = inspect_checkpoint(actor)
    assert state.problems == [
        f"rank 2 model shard model_world_size_4_rank_2.pt is {shard_problem(actor / 'model_world_size_4_rank_2.pt')}",
        "rank 3 optim shard optim_world_size_4_rank_3.pt is missing",
    ]
    with pytest.raises(CheckpointError) as info:
        wait_for_checkpoint(actor, deadline_s=0)
    (line,) = str(info.value).splitlines()
    assert "incomplete after 0s: rank 2 model shard" in line and "(+1 more)" in line


def test_the_wait_ends_when_the_workers_shard_arrives(tmp_path: Path) -> None:
    actor = write_checkpoint(tmp_path, 10)
    shard = actor / "model_world_size_4_rank_3.pt"
    whole = shard.read_bytes()
    shard.unlink()
    now = [0.0]

    def sleep(seconds: float) -> None:  # the worker's rclone uploads it during the second interval
        now[0] += seconds
        if now[0] >= 30:
            shard.write_bytes(whole)

    state = wait_for_checkpoint(actor, deadline_s=300, interval_s=15, sleep=sleep, clock=lambda: now[0])
    assert state.complete and now[0] == 30


def test_merge_refuses_a_checkpoint_with_a_missing_worker_shard(tmp_path: Path) -> None:
    actor = write_checkpoint(tmp_path / "run", 20)
    (actor / "model_world_size_4_rank_3.pt").unlink()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "searchrl",
            "train",
            "merge",
            "--run-dir",
            str(tmp_path / "run"),
            "--wait",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert (
        line.startswith("error: checkpoint ")
        and "rank 3 model shard model_world_size_4_rank_3.pt is missing" in line
    )
    assert not (tmp_path / "run" / "merged").exists()  # verl's merger never ran


def test_resume_passes_over_a_short_shard_to_the_last_complete_step(tmp_path: Path) -> None:
    run = tmp_path / "ckpt" / "exp"
    write_checkpoint(run, 10)
    actor = write_checkpoint(run, 20)
    cut_short(actor / "optim_world_size_4_rank_2.pt")
    assert check_resume(run, deadline_s=0) == 10  # tests/trainer/test_resume_fallback.py: the warning, verl
    assert check_resume(tmp_path / "fresh", deadline_s=0) is None  # no tracker: a fresh start
    (run / TRACKER_FILE).write_text("10")
    assert check_resume(run, deadline_s=0) == 10


def test_train_local_checks_the_resume_step_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchrl.trainer.launch

    actor = write_checkpoint(tmp_path / "ckpt" / "exp", 30)
    (actor / "extra_state_world_size_4_rank_1.pt").unlink()
    monkeypatch.setattr(
        searchrl.trainer.launch, "prepare_data", lambda *a, **k: pytest.fail("must refuse before data")
    )
    monkeypatch.setattr(searchrl.trainer.launch, "check_stack", lambda *a, **k: "580.65.06")  # no GPU here
    settings = TrainSettings(
        checkpoint_dir=tmp_path / "ckpt", experiment_name="exp", gpus_per_node=1, checkpoint_wait_s=0
    )
    # the run's own record: the settings check passes, the shard check does not
    searchrl.trainer.launch.record_run(settings, [])
    with pytest.raises(
        CheckpointError,
        match=r"not resuming: .*rank 1 extra_state shard .* is missing; .*; no earlier complete step",
    ):
        prepare_launch(settings, gpus=1)
