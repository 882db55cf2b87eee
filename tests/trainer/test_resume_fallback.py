"""Resume falls back from an incomplete newest checkpoint to the newest complete step, and verl loads that step.

The checkpoints are real `torch.save` shards in verl's FSDP layout (tests/trainer/test_checkpoint.py); the
plan comes from `prepare_launch` against a live retrieval service; the step verl loads is decided by verl's
own `RayPPOTrainer._load_checkpoint` over the hydra config our overrides compose to.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from searchrl.errors import CheckpointError
from searchrl.trainer.checkpoint import TRACKER_FILE, check_resume
from searchrl.trainer.launch import prepare_launch, record_run
from searchrl.trainer.settings import TrainSettings
from tests.trainer.conftest import compose_verl, fixture_settings
from tests.trainer.test_checkpoint import cut_short, write_checkpoint


def test_an_incomplete_newest_step_falls_back_to_the_newest_complete_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="searchrl.trainer.checkpoint")
    run = tmp_path / "exp"
    write_checkpoint(run, 10)
    write_checkpoint(run, 20)
    cut_short(write_checkpoint(run, 30) / "model_world_size_4_rank_3.pt")  # a worker died mid-upload
    assert check_resume(run, deadline_s=0) == 20
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"step 30 in {run} is incomplete (checkpoint ")
    assert "rank 3 model shard model_world_size_4_rank_3.pt is short" in warning
    assert "resuming from step 20, the newest complete one; steps 21-30 are trained again" in warning
    assert (run / TRACKER_FILE).read_text() == "30"  # the bucket is left as it is


def test_no_complete_step_at_all_is_still_refused(tmp_path: Path) -> None:
    run = tmp_path / "exp"
    (write_checkpoint(run, 10) / "optim_world_size_4_rank_1.pt").unlink()
    (write_checkpoint(run, 20) / "fsdp_config.json").unlink()
    with pytest.raises(CheckpointError) as info:
        check_resume(run, deadline_s=0)
    (line,) = str(info.value).splitlines()
    assert line.startswith(
        f"not resuming: checkpoint {run / 'global_step_20' / 'actor'} incomplete after 0s: "
    )
    assert f"no earlier complete step exists in {run}: start fresh with another EXPERIMENT_NAME" in line


def _load_as_verl(overrides: list[str]) -> tuple[int, list[str]]:
    """The step and actor folder verl's own `_load_checkpoint` picks from the composed config."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    loaded: list[str] = []
    trainer: Any = SimpleNamespace(
        config=compose_verl(overrides),
        actor_rollout_wg=SimpleNamespace(load_checkpoint=lambda path, **kw: loaded.append(path)),
        use_critic=False,
        global_steps=0,
    )
    RayPPOTrainer._load_checkpoint(trainer)
    return trainer.global_steps, loaded


def _settings(tmp_path: Path, qa_sample: Path, url: str) -> TrainSettings:
    settings = fixture_settings(
        tmp_path,
        qa_sample,
        [url],
        flash_attn=False,  # no flash-attn here; the launch check refuses FLASH_ATTN=1 without it
        health_deadline_s=2,
        checkpoint_wait_s=0,
        total_steps=50,
    )
    record_run(settings, [])  # the run's own record: the settings check passes
    return settings


@pytest.mark.parametrize("newest_complete", [True, False], ids=["complete", "incomplete"])
def test_verl_resumes_from_the_step_the_launch_chose(
    tmp_path: Path,
    qa_sample: Path,
    live_bm25_url: str,
    nvidia_smi: Any,
    monkeypatch: pytest.MonkeyPatch,
    newest_complete: bool,
) -> None:
    monkeypatch.setattr("searchrl.trainer.launch.installed_cuda", lambda: None)
    settings = _settings(tmp_path, qa_sample, live_bm25_url)
    run = settings.run_dir.expanduser().resolve()
    write_checkpoint(run, 10)
    newest = write_checkpoint(run, 20)
    if not newest_complete:
        (newest / "extra_state_world_size_4_rank_2.pt").unlink()
    plan = prepare_launch(settings, gpus=1, nvidia_smi=nvidia_smi("580.95.05"))
    overrides = plan.command[3:]
    assert plan.command[1:3] == ["-m", "verl.trainer.main_ppo"]
    modes = [o for o in overrides if o.startswith("trainer.resume_mode=")]
    step, loaded = _load_as_verl(overrides)
    if newest_complete:  # the tracker's step: verl's resume_mode=auto, as before
        assert modes == ["trainer.resume_mode=auto"]
        assert (step, loaded) == (20, [str(run / "global_step_20" / "actor")])
    else:
        assert modes == ["trainer.resume_mode=resume_path"]
        assert f"trainer.resume_from_path={run / 'global_step_10'}" in overrides
        assert (step, loaded) == (10, [str(run / "global_step_10" / "actor")])
    assert (plan.record_dir / "overrides.txt").read_text().splitlines() == overrides  # type: ignore[operator]
