"""TrainSettings: recipe defaults, the env names users know, loud typos, bad combinations, redaction."""

from __future__ import annotations

import pytest

from searchrl.config import load_settings
from searchrl.errors import ConfigError
from trainer.settings import TrainSettings, redact_url


def test_defaults_are_the_search_r1_recipe():
    s = TrainSettings()
    assert s.model_name == "Qwen/Qwen2.5-3B-Instruct"
    assert (s.train_batch_size, s.mini_batch_size, s.rollout_n) == (512, 256, 5)
    assert (s.lr, s.kl_coef, s.kl_loss_type) == (1e-6, 0.001, "low_var_kl")
    assert (s.topk, s.max_turns, s.total_steps) == (3, 4, 1005)
    assert s.dataset_size == "full" and s.qa_source == "PeterJinGo/nq_hotpotqa_train"


@pytest.mark.parametrize(
    ("env", "value", "field", "expected"),
    [
        ("DATASET_SIZE", "small", "dataset_size", "small"),
        ("MODEL_NAME", "Qwen/Qwen2.5-7B", "model_name", "Qwen/Qwen2.5-7B"),
        ("TRAIN_BATCH_SIZE", "64", "train_batch_size", 64),
        ("TOTAL_STEPS", "12", "total_steps", 12),
        ("NUM_NODES", "2", "nnodes", 2),
        ("GPUS_PER_NODE", "4", "gpus_per_node", 4),
        ("EXPERIMENT_NAME", "exp1", "experiment_name", "exp1"),
        ("ROLLOUT_N", "8", "rollout_n", 8),
        ("MAX_TURNS", "2", "max_turns", 2),
        ("SEARCHRL_TRAIN_DATASET_SIZE", "medium", "dataset_size", "medium"),
        ("SEARCHRL_TRAIN_LR", "2e-6", "lr", 2e-6),
    ],
)
def test_env_names(monkeypatch, env, value, field, expected):
    monkeypatch.setenv(env, value)
    assert getattr(TrainSettings(), field) == expected


def test_flags_beat_env(monkeypatch):
    monkeypatch.setenv("DATASET_SIZE", "medium")
    assert TrainSettings(dataset_size="small").dataset_size == "small"


def test_retrieval_urls_comma_separated(monkeypatch):
    monkeypatch.setenv("RETRIEVAL_SERVICE_URL", " http://a:8000/ , http://b:8000 ")
    assert TrainSettings().retrieval_urls == ["http://a:8000", "http://b:8000"]


def test_misspelled_knobs_fail_loudly(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="dataset_sise"):
        TrainSettings(dataset_sise="small")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("SEARCHRL_TRAIN_TOTAL_STEPZ=5\n")
    with pytest.raises(ConfigError, match="SEARCHRL_TRAIN_TOTAL_STEPZ"):
        load_settings(TrainSettings)
    (tmp_path / ".env").write_text("")
    monkeypatch.setenv("SEARCHRL_TRAIN_MODEL", "x")
    with pytest.raises(ConfigError, match="SEARCHRL_TRAIN_MODEL"):
        load_settings(TrainSettings)


def test_shared_env_file_with_other_areas_keys_is_fine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(
        "RETRIEVAL_API_KEY=abc\nWANDB_API_KEY=x\nSEARCHRL_RETRIEVAL_PORT=9000\nDATASET_SIZE=small\n"
        "SEARCHRL_TRAIN_TOTAL_STEPS=7\n"
    )
    s = TrainSettings()
    assert (s.dataset_size, s.total_steps) == ("small", 7)
    assert TrainSettings(DATASET_SIZE="medium").dataset_size == "medium"  # aliases work as keywords too


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset_size": "huge"}, "dataset_size"),
        ({"train_batch_size": 16, "ppo_mini_batch_size": 32}, "must not exceed train_batch_size"),
        ({"train_batch_size": 96, "ppo_mini_batch_size": 64}, "multiple of ppo_mini_batch_size"),
        ({"train_batch_size": 4, "rollout_n": 1}, "divisible by the GPU count"),
        ({"rollout_tp": 3}, "rollout_tp"),
        ({"retrieval_urls": "ftp://x"}, "http://"),
        ({"retrieval_urls": ""}, "RETRIEVAL_SERVICE_URL"),
        ({"retrieval_api_key_env": "sk-live-123"}, "NAME"),
        ({"retrieval_api_key_env": "a1b2c3d4e5f6"}, "NAME"),
        ({"logger": "console,wandbb"}, "unknown logger"),
        ({"max_ckpt_to_keep": 1}, "max_ckpt_to_keep"),
    ],
)
def test_bad_values_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(TrainSettings, **kwargs)


def test_api_key_error_never_echoes_the_value():
    with pytest.raises(ConfigError) as info:
        load_settings(TrainSettings, retrieval_api_key_env="sk-live-123")
    assert "sk-live-123" not in str(info.value)


def test_logger_auto_follows_wandb_key(monkeypatch):
    assert TrainSettings().loggers == ["console"]
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert TrainSettings().loggers == ["console", "wandb"]
    assert TrainSettings(logger="console").loggers == ["console"]


def test_derived_paths_and_budgets(tmp_path):
    s = TrainSettings(
        data_dir=tmp_path, dataset_size="small", checkpoint_dir=tmp_path / "ck", experiment_name="e"
    )
    assert s.train_file == tmp_path / "small" / "train.parquet"
    assert s.test_file == tmp_path / "small" / "test.parquet"
    assert s.run_dir == tmp_path / "ck" / "e"
    assert s.resolved_tool_config_path == tmp_path / "search_tool.yaml"
    assert s.max_tool_response_chars > s.topk * s.passage_max_chars
    assert s.token_budget_per_gpu >= s.max_prompt_length + s.max_response_length


def test_redaction():
    assert redact_url("http://user:pw@host:8000/x") == "http://***@host:8000/x"
    assert redact_url("http://host:8000") == "http://host:8000"
    dump = TrainSettings(retrieval_urls="http://u:secret@h:1").redacted_dump()
    assert "secret" not in str(dump)
