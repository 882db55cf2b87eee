"""make train-local's logic: GPU check, data, tool config, live health check, run record, verl command."""

from __future__ import annotations

import json

import pytest

from searchrl.errors import ConfigError, RetrievalUnavailableError
from tests.live import free_port
from trainer.launch import check_gpus, count_gpus, prepare_launch, train_local
from trainer.overrides import main_ppo_command, render_overrides
from trainer.settings import TrainSettings


def _settings(tmp_path, qa_sample, urls, **kw):
    return TrainSettings(
        qa_source=str(qa_sample),
        dataset_size="small",
        data_dir=tmp_path / "data",
        checkpoint_dir=tmp_path / "ckpt",
        retrieval_urls=urls,
        gpus_per_node=1,
        train_batch_size=8,
        health_deadline_s=2,
        **kw,
    )


def test_this_machine_has_no_gpu_so_launch_stops_first(tmp_path, qa_sample):
    assert count_gpus() == 0
    settings = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="no GPU on this machine"):
        train_local(settings, runner=lambda cmd: pytest.fail("must not start verl"))
    assert not (tmp_path / "data").exists()  # stopped before doing any work


def test_too_few_gpus_names_the_knob():
    with pytest.raises(ConfigError, match="set GPUS_PER_NODE=2"):
        check_gpus(TrainSettings(), found=2)
    assert check_gpus(TrainSettings(gpus_per_node=2, train_batch_size=8), found=4) == 4


@pytest.mark.live
def test_launch_on_a_gpu_node(tmp_path, qa_sample, live_bm25_url, monkeypatch):
    monkeypatch.setenv("RETRIEVAL_API_KEY", "tok-abc-123")
    dead = f"http://127.0.0.1:{free_port()}"
    settings = _settings(tmp_path, qa_sample, [dead, live_bm25_url])
    started = []
    rc = train_local(settings, gpus=1, runner=lambda cmd: started.append(cmd) or 0)

    assert rc == 0
    (cmd,) = started
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert cmd == main_ppo_command(settings, cmd[0])
    assert settings.train_file.is_file() and settings.test_file.is_file()
    assert settings.resolved_tool_config_path.is_file()

    record = settings.run_dir / "searchrl"
    assert (record / "overrides.txt").read_text().splitlines() == render_overrides(settings)
    saved = json.loads((record / "settings.json").read_text())
    assert saved["dataset_size"] == "small" and saved["retrieval_api_key_env"] == "RETRIEVAL_API_KEY"
    for path in record.iterdir():
        assert "tok-abc-123" not in path.read_text()


@pytest.mark.live
def test_failover_url_is_enough(tmp_path, qa_sample, live_bm25_url):
    plan = prepare_launch(
        _settings(tmp_path, qa_sample, [f"http://127.0.0.1:{free_port()}", live_bm25_url]), gpus=1
    )
    assert plan.healthy_urls == [live_bm25_url]


def test_no_healthy_retrieval_stops_before_training(tmp_path, qa_sample):
    settings = _settings(tmp_path, qa_sample, [f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(RetrievalUnavailableError, match="no retrieval service answers") as info:
        train_local(settings, gpus=1, runner=lambda cmd: pytest.fail("must not start verl"))
    assert "unreachable" in str(info.value)
    assert not (settings.run_dir / "searchrl").exists()
