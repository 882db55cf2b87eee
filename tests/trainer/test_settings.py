"""TrainSettings: recipe defaults, the env names users know, loud typos, bad combinations, redaction."""

from __future__ import annotations

import pytest

from searchrl.config import load_settings
from searchrl.errors import ConfigError
from searchrl.trainer.settings import TrainSettings
from searchrl.urls import redact_url
from tests.conftest import REPO


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
        ("ROLLOUT", "sglang", "rollout_name", "sglang"),
        ("ALLOW_SMALL_CORPUS", "1", "allow_small_corpus", True),
        ("SMOKE", "1", "smoke", True),
        ("FLASH_ATTN", "0", "flash_attn", False),
        ("TRAINER_MODE", "colocate_async", "trainer_mode", "colocate_async"),
        ("REHEARSE_MULTI_NODE", "1", "rehearse_multi_node", True),
        ("SEARCHRL_TRAIN_DATASET_SIZE", "medium", "dataset_size", "medium"),
        ("SEARCHRL_TRAIN_LR", "2e-6", "lr", 2e-6),
    ],
)
def test_env_names(monkeypatch, env, value, field, expected):
    monkeypatch.setenv(env, value)
    if (
        env == "ROLLOUT"
    ):  # sglang 0.5.12 reads back Llama, not the default Qwen2 (trainer/weight_sync/sglang_readback.py)
        monkeypatch.setenv("MODEL_NAME", "meta-llama/Llama-3.2-3B-Instruct")
    assert getattr(TrainSettings(), field) == expected


def test_rollout_log_probs_have_the_actors_semantics_or_the_settings_are_refused():
    """Issue 46 item 1: vLLM's processed log-probs are renormalised over the top-p nucleus, the actor's are not."""
    assert TrainSettings().top_p == 0.95 and TrainSettings().rollout_logprobs_mode == "raw_logprobs"
    # no nucleus: processed (after temperature) is the actor's at any temperature
    assert TrainSettings(top_p=1.0, temperature=0.7).rollout_logprobs_mode == "processed_logprobs"
    with pytest.raises(ValueError, match=r"top_p 0\.9 with temperature 0\.7: .*set SEARCHRL_TRAIN_TOP_P=1"):
        TrainSettings(top_p=0.9, temperature=0.7)


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


# --- trainer modes (issue 40 item 1) -----------------------------------------------------------------------


def test_sync_is_the_default_and_the_async_knobs_have_search_defaults():
    s = TrainSettings()
    assert (s.trainer_mode, s.parameter_sync_step, s.rollout_node_count, s.trainer_nodes) == ("sync", 1, 0, 1)
    # at most one update of lag, dropped beyond it (docs/training.md "Trainer modes" says why not verl's 8)
    assert (s.max_off_policy_threshold, s.max_off_policy_strategy, s.num_warmup_batches) == (2, "drop", 1.0)


def test_sky_envs_reach_the_mode_and_the_rollout_nodes(monkeypatch):
    monkeypatch.setenv("TRAINER_MODE", "separate_async")
    monkeypatch.setenv("ROLLOUT_NODES", "2")
    monkeypatch.setenv("NUM_NODES", "4")
    s = TrainSettings()
    assert (s.trainer_mode, s.rollout_node_count, s.trainer_nodes, s.n_gpus) == ("separate_async", 2, 2, 16)


def test_separate_async_splits_the_nodes_and_keeps_fsdp_in_the_trainer_node():
    """Two nodes: one trains, one generates. The trainer then has one node, so FSDP spans it alone (-1) with a
    gradient sync per micro batch, as on any one-node run; the sync run on the same two nodes shards per node."""
    sync = TrainSettings(nnodes=2)
    assert (sync.trainer_nodes, sync.n_gpus, sync.fsdp_size, sync.sync_grads_per_mini_batch) == (
        2,
        16,
        8,
        True,
    )
    sep = TrainSettings(nnodes=2, trainer_mode="separate_async")
    assert (sep.trainer_nodes, sep.rollout_node_count, sep.n_gpus) == (1, 1, 8)
    assert (sep.fsdp_size, sep.sync_grads_per_mini_batch) == (-1, False)
    three = TrainSettings(nnodes=3, trainer_mode="separate_async")  # two trainer nodes: FSDP per node again
    assert (three.trainer_nodes, three.fsdp_size, three.sync_grads_per_mini_batch) == (2, 8, True)
    # verl asserts train_batch_size == parameter_sync_step x ppo_mini_batch_size in separate_async
    assert (
        sep.parameter_sync_step == 2 and sep.parameter_sync_step * sep.mini_batch_size == sep.train_batch_size
    )
    one = TrainSettings(nnodes=2, trainer_mode="separate_async", ppo_mini_batch_size=128)
    assert one.parameter_sync_step == 4
    assert TrainSettings(nnodes=2, trainer_mode="colocate_async").parameter_sync_step == 1  # verl's fixed 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trainer_mode": "async"}, "trainer_mode.*'sync', 'colocate_async' or 'separate_async'"),
        ({"max_off_policy_threshold": 0}, "max_off_policy_threshold.*greater than or equal to 1"),
        ({"max_off_policy_strategy": "keep"}, "max_off_policy_strategy.*'drop' or 'wait'"),
        ({"nnodes": 2, "rollout_nodes": 1}, "ROLLOUT_NODES=1 applies to TRAINER_MODE=separate_async only"),
        (
            {"trainer_mode": "colocate_async", "checkpoint_engine_module": "m"},
            "checkpoint_engine_module applies to TRAINER_MODE=separate_async only",
        ),
        ({"trainer_mode": "separate_async"}, "needs a trainer node beside the rollout nodes.*NUM_NODES=1"),
        (
            {"trainer_mode": "separate_async", "nnodes": 2, "rollout_nodes": 2},
            "ROLLOUT_NODES=2 leaves none of NUM_NODES=2",
        ),
        (
            {"trainer_mode": "separate_async", "nnodes": 2, "checkpoint_engine": "naive"},
            "refuses the in-process 'naive' one",
        ),
        # 256 x 5 samples split over 4 x 8 GPUs in sync, not over the 3 trainer nodes' 24 in separate_async
        (
            {"trainer_mode": "separate_async", "nnodes": 4},
            r"\(256 x 5\) must be divisible by the trainer's GPU count .* \(\(4 - 1\) x 8\)",
        ),
    ],
)
def test_bad_mode_settings_are_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(TrainSettings, **kwargs)
    assert "\n" not in str(info.value)


def test_the_mini_batch_rule_counts_every_gpu_in_the_modes_that_train_on_every_node():
    assert TrainSettings(nnodes=4).n_gpus == 32  # 1280 / 32: accepted
    assert TrainSettings(nnodes=4, trainer_mode="colocate_async").n_gpus == 32


# --- the multi-node trainer rehearsed on one node (issue 53 item 4) -------------------------------------------------


def test_the_rehearsal_renders_the_multi_node_fsdp_layout_on_one_node():
    """REHEARSE_MULTI_NODE=1 on 1 x 8 GPUs: what NUM_NODES=2 renders (FSDP2, one sync per mini batch, HSDP), as 2
    replicas of 4 GPUs inside the node; the mini batch still splits over the node's 8 GPUs."""

    def layout(s: TrainSettings) -> tuple[int, int, bool, str]:
        return s.fsdp_size, s.fsdp_replicas, s.sync_grads_per_mini_batch, s.fsdp_strategy

    # verl's defaults on one node: one group, a sync per micro batch
    assert layout(TrainSettings()) == (-1, 1, False, "fsdp")
    assert layout(TrainSettings(nnodes=2)) == (8, 2, True, "fsdp2")
    rehearsal = TrainSettings(rehearse_multi_node=True)
    assert (rehearsal.trainer_nodes, rehearsal.n_gpus) == (1, 8)
    assert layout(rehearsal) == (4, 2, True, "fsdp2")
    assert layout(TrainSettings(rehearse_multi_node=True, gpus_per_node=4, train_batch_size=8))[:2] == (2, 2)
    assert TrainSettings().rehearse_multi_node is False  # off by default


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"nnodes": 2},
            r"REHEARSE_MULTI_NODE=1 rehearses the multi-node trainer on one node, but NUM_NODES=2 already renders "
            r"FSDP2, no-sync and HSDP across the nodes: unset REHEARSE_MULTI_NODE or use NUM_NODES=1",
        ),
        # separate_async needs 2 nodes, so the rehearsal never meets it on one
        ({"nnodes": 3, "trainer_mode": "separate_async"}, "but NUM_NODES=3 already renders"),
        ({"gpus_per_node": 1, "train_batch_size": 8}, r"but GPUS_PER_NODE=1: use an even count of 4 or more"),
        ({"gpus_per_node": 2, "train_batch_size": 8}, r"2 HSDP groups .* but GPUS_PER_NODE=2: use an even"),
        ({"gpus_per_node": 5, "train_batch_size": 10}, r"but GPUS_PER_NODE=5: use an even count of 4"),
        ({"smoke": True}, r"GPUS_PER_NODE=1 \(SMOKE=1's one GPU unless GPUS_PER_NODE is set\)"),
        # the mini batch rule still holds: 256 x 5 samples do not split over 6 GPUs
        ({"gpus_per_node": 6}, r"\(256 x 5\) must be divisible by the GPU count .* \(1 x 6\)"),
    ],
)
def test_a_rehearsal_that_makes_no_sense_is_a_one_line_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(TrainSettings, rehearse_multi_node=True, **kwargs)
    assert "\n" not in str(info.value)


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


# --- steps mean steps (verl's own dataloader arithmetic) -----------------------------------------------------


def _verl_schedule(
    settings: TrainSettings, overrides: list[str], train_rows: int, compose
) -> tuple[int, int]:
    """(total_training_steps, steps verl's fit loop runs) from verl's own RayPPOTrainer._create_dataloader."""
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    cfg = compose([*overrides, "data.dataloader_num_workers=0"])  # no worker processes in a unit test
    trainer = SimpleNamespace(config=cfg)
    dataset = [{"i": i} for i in range(train_rows)]
    RayPPOTrainer._create_dataloader(trainer, dataset, dataset[:8], lambda batch: batch, None)
    # fit() loops `for epoch in range(total_epochs): for batch in train_dataloader` and returns at
    # global_steps >= total_training_steps: it runs whichever is smaller.
    steps_run = min(trainer.total_training_steps, len(trainer.train_dataloader) * cfg.trainer.total_epochs)
    return trainer.total_training_steps, steps_run


@pytest.mark.parametrize(
    ("rows", "batch", "steps"), [(1_000, 512, 1005), (10_000, 512, 1005), (1_000, 16, 4)]
)
def test_verl_runs_every_step_the_lr_schedule_assumes(compose, tmp_path, rows, batch, steps, capsys):
    from searchrl.trainer.overrides import render_overrides

    settings = TrainSettings(
        data_dir=tmp_path, train_batch_size=batch, total_steps=steps, ppo_mini_batch_size=min(batch, 256)
    )
    schedule, steps_run = _verl_schedule(settings, render_overrides(settings, train_rows=rows), rows, compose)
    assert schedule == steps == steps_run


def test_a_set_epoch_count_that_stops_early_is_refused_with_the_numbers(tmp_path):
    settings = TrainSettings(data_dir=tmp_path, dataset_size="small", total_epochs=100)
    with pytest.raises(ConfigError) as caught:
        settings.epochs_for(1_000)
    assert str(caught.value).startswith(
        "verl would stop at step 100 (100 epochs x 1 steps of 1000 rows // batch 512) while TOTAL_STEPS=1005"
    )
    assert settings.model_copy(update={"total_steps": 100}).epochs_for(1_000) == 100


def test_fewer_rows_than_one_batch_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="200 train rows .* no full batch of TRAIN_BATCH_SIZE=512"):
        TrainSettings(data_dir=tmp_path).epochs_for(200)


def test_expected_rows_before_and_after_data_prep(tmp_path):
    s = TrainSettings(data_dir=tmp_path, dataset_size="small")
    assert s.expected_train_rows() == 1_000
    assert TrainSettings(data_dir=tmp_path).expected_train_rows() == 169_615
    s.split_dir.mkdir(parents=True)
    (s.split_dir / "meta.json").write_text('{"train_rows": 997}')
    assert s.expected_train_rows() == 997
    with pytest.raises(ConfigError, match="unknown until `searchrl train data`"):
        TrainSettings(data_dir=tmp_path, qa_source=str(tmp_path / "qa.jsonl")).expected_train_rows()


# --- one run, one folder ---------------------------------------------------------------------------------------


def test_default_experiment_name_holds_model_size_and_steps(monkeypatch):
    assert TrainSettings().experiment_name == "search-r1-qwen2.5-3b-instruct-full-1005steps"
    monkeypatch.setenv("EXPERIMENT_NAME", "")  # the YAMLs' default: derive it
    monkeypatch.setenv("DATASET_SIZE", "small")
    monkeypatch.setenv("TOTAL_STEPS", "50")
    assert TrainSettings().experiment_name == "search-r1-qwen2.5-3b-instruct-small-50steps"
    assert TrainSettings(experiment_name="mine").experiment_name == "mine"
    with pytest.raises(ValueError, match="must be one folder name"):
        TrainSettings(experiment_name="../elsewhere")


def test_smoke_preset_fills_defaults_but_user_values_win(monkeypatch):
    monkeypatch.setenv("SMOKE", "1")
    s = TrainSettings()
    assert (s.model_name, s.dataset_size, s.total_steps, s.gpus_per_node) == (
        "Qwen/Qwen2.5-0.5B-Instruct",
        "small",
        4,
        1,
    )
    assert s.allow_small_corpus and s.dump_rollouts and s.save_freq == 2
    assert s.experiment_name == "search-r1-qwen2.5-0.5b-instruct-small-4steps"
    assert s.experiment_name != TrainSettings(smoke=False).experiment_name  # smoke never resumes a full run
    monkeypatch.setenv("TOTAL_STEPS", "6")
    assert TrainSettings().total_steps == 6


# --- attention: FLASH_ATTN is the switch, attn_implementation its older spelling (issue 38) ----------------------


def test_flash_attn_is_the_default_and_flash_attn_0_is_sdpa(monkeypatch):
    s = TrainSettings()
    assert s.flash_attn is True and s.attention == "flash_attention_2" and s.removes_padding
    monkeypatch.setenv("FLASH_ATTN", "0")
    off = TrainSettings()
    assert off.flash_attn is False and off.attention == "sdpa"
    # sdpa packs or pads as the plan's arithmetic chooses (trainer/step_cost.py); remove_padding=off forces padded
    assert not TrainSettings(remove_padding="off").removes_padding
    assert TrainSettings(flash_attn=True).attention == "flash_attention_2"  # a flag beats the environment


def test_attn_implementation_still_works_and_is_folded_into_flash_attn(monkeypatch):
    assert TrainSettings(attn_implementation="sdpa").flash_attn is False
    assert TrainSettings(attn_implementation="flash_attention_2").flash_attn is True
    monkeypatch.setenv("SEARCHRL_TRAIN_ATTN_IMPLEMENTATION", "sdpa")
    s = TrainSettings()
    assert (s.flash_attn, s.attention) == (False, "sdpa")
    assert s.attn_implementation is None  # one source of truth after validation: flash_attn
    assert s.redacted_dump()["flash_attn"] is False
    monkeypatch.setenv("FLASH_ATTN", "0")  # both, agreeing
    assert TrainSettings().attention == "sdpa"
    monkeypatch.setenv("FLASH_ATTN", "1")  # both, contradicting: one line naming the fix
    with pytest.raises(
        ConfigError, match=r"FLASH_ATTN=1 contradicts attn_implementation=sdpa: set only FLASH_ATTN"
    ):
        load_settings(TrainSettings)


def test_the_cpu_runs_keep_sdpa_whatever_the_environment_says(monkeypatch, tmp_path):
    """`searchrl train cpu` (and learn-cpu, train-cpu-real, built on the same settings) has no flash-attn."""
    from searchrl.trainer.overrides import render_overrides
    from searchrl.trainer.proofs.learn import learn_settings
    from searchrl.trainer.proofs.train_cpu import cpu_settings

    monkeypatch.setenv("FLASH_ATTN", "1")
    for settings in (
        cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:1"),
        learn_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:1", seed=1),
    ):
        assert settings.attention == "sdpa" and not settings.removes_padding
        overrides = render_overrides(settings, train_rows=8)
        assert "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in overrides
        assert "actor_rollout_ref.model.use_remove_padding=False" in overrides


def test_presets_built_on_other_settings_validate_their_changes():
    """Issue 47: `model_copy(update=...)` validates nothing, so a preset's misspelled key passed silently."""
    base = TrainSettings()
    assert base.model_copy(update={"rollout_nn": 4}).rollout_n == base.rollout_n  # the bug class: no error
    with pytest.raises(ValueError, match="rollout_nn"):
        base.with_changes(rollout_nn=4)
    with pytest.raises(ValueError, match="rollout_n"):
        base.with_changes(rollout_n=0)
    changed = base.with_changes(rollout_n=4, lr=1e-5)
    assert (changed.rollout_n, changed.lr) == (4, 1e-5)
    assert changed.model_dump() == {**base.model_dump(), "rollout_n": 4, "lr": 1e-5}
    # every copy goes through it (searchrl/config.py StrictSettings.with_changes, every settings model's): no product
    # module copies anything with model_copy (the learn and real-learn presets did, and 15 retrieval, bench and infer
    # copies did, issue 54 item 5) but the web backend's passage documents, which are no settings
    copies = [
        p.relative_to(REPO).as_posix()
        for area in ("searchrl", "retrieval", "trainer", "infer")
        for p in (REPO / area).rglob("*.py")
        if ".model_copy(" in p.read_text()
    ]
    assert copies == ["retrieval/backends/web/backend.py"], copies
