"""The rendered overrides compose with verl's own hydra config and pass verl's own validation."""

from __future__ import annotations

import warnings

import pytest

from searchrl.trainer.overrides import (
    FLASHINFER_SAMPLER_KEY,
    REWARD_FN_NAME,
    REWARD_FN_PATH,
    SAMPLER_ASYNC_NAME,
    SAMPLER_NAME,
    SAMPLER_PATH,
    VLLM_SYNC_KEY,
    hydra_value,
    main_ppo_command,
    merge_overrides,
    render_overrides,
)
from searchrl.trainer.settings import TrainSettings


def _validated(cfg):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's RolloutConfig dataclass
    with pytest.warns(UserWarning, match="Disabled critic"):
        use_ref, use_critic = need_reference_policy(cfg), need_critic(cfg)
    validate_config(cfg, use_reference_policy=use_ref, use_critic=use_critic)
    return rollout, use_ref, use_critic


def test_defaults_compose_into_a_search_agent_grpo_run(compose, tmp_path):
    settings = TrainSettings(data_dir=tmp_path / "data", checkpoint_dir=tmp_path / "ckpt")
    cfg = compose(render_overrides(settings))
    rollout, use_ref, use_critic = _validated(cfg)

    # The settings that decide whether the model ever calls the tool (DESIGN.md section 3).
    assert type(rollout).__name__ == "RolloutConfig"
    assert rollout.name == "vllm" and rollout.mode == "async"  # the engine whose lock resolves as published
    assert rollout.multi_turn.enable is True
    assert rollout.multi_turn.format == "hermes"
    assert rollout.multi_turn.tool_config_path == str((tmp_path / "data" / "search_tool.yaml").resolve())
    assert (
        rollout.agent.default_agent_loop == "searchrl_tool_agent"
    )  # ours: it records what the server generated
    assert cfg.data.return_raw_chat is True
    assert cfg.data.tool_config_path == rollout.multi_turn.tool_config_path  # the dataset sees the same tools
    # Observations fit: 3 passages of 800 characters each plus framing, far above verl's 256 default.
    assert rollout.multi_turn.max_tool_response_length >= 3 * 800
    assert rollout.multi_turn.max_assistant_turns == 5 and rollout.multi_turn.max_user_turns == 4

    # Search-R1 recipe (DESIGN.md section 6).
    assert cfg.algorithm.adv_estimator == "grpo" and use_critic is False
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-3B-Instruct"
    assert cfg.data.train_batch_size == 512 and rollout.n == 5
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True and use_ref is True
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == pytest.approx(0.001)
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert cfg.trainer.total_training_steps == 1005

    # Reward: every data source goes to our scorer.
    assert cfg.reward.custom_reward_function.path == REWARD_FN_PATH
    assert cfg.reward.custom_reward_function.name == REWARD_FN_NAME

    # Checkpoints that survive preemption.
    assert cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.save_freq > 0 and cfg.trainer.max_actor_ckpt_to_keep >= 2
    assert cfg.trainer.default_local_dir == str(
        (tmp_path / "ckpt" / "search-r1-qwen2.5-3b-instruct-full-1005steps").resolve()
    )
    # Enough epochs for 1005 steps of 169,615 rows // 512 = 331 steps each (verl stops at epochs x steps).
    assert cfg.trainer.total_epochs * (169_615 // 512) >= 1005

    # Validation is capped: verl's default sends the whole test split (51,713 rows) as one batch.
    assert cfg.data.val_max_samples == 1000 and cfg.data.val_batch_size == 256

    # flash-attn 2 (FLASH_ATTN=1, the default) with packed micro batches (tests below say how many tokens).
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    # One node: verl's FSDP defaults (one group over the node's GPUs, a reduce-scatter per micro batch).
    for role in ("actor", "ref"):
        assert cfg.actor_rollout_ref[role].fsdp_config.fsdp_size == -1
        assert cfg.actor_rollout_ref[role].strategy == "fsdp"  # verl's FSDP1 (fp32 sharded accumulation)
    assert cfg.actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation is False


def test_reward_function_path_loads_ours(compose, tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = compose(render_overrides(TrainSettings(data_dir=tmp_path)))
    fn = get_custom_reward_fn(cfg)
    assert (
        fn(
            data_source="searchR1_nq",
            solution_str="<answer>Paris</answer>",
            ground_truth={"target": ["paris"]},
        )["score"]
        == 1.0
    )


def test_environment_reaches_the_composed_config(compose, monkeypatch, tmp_path):
    for name, value in {
        "DATASET_SIZE": "small",
        "MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct",
        "TRAIN_BATCH_SIZE": "64",
        "TOTAL_STEPS": "10",
        "NUM_NODES": "2",
        "GPUS_PER_NODE": "4",
        "EXPERIMENT_NAME": "smoke",
        "CHECKPOINT_DIR": str(tmp_path / "ck pt"),  # a space: the value must be quoted for hydra
        "RETRIEVAL_SERVICE_URL": "http://10.0.0.1:8000,http://10.0.0.2:8000",
        "SEARCHRL_TRAIN_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    settings = TrainSettings()
    cfg = compose(render_overrides(settings))
    _validated(cfg)
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.data.train_batch_size == 64 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 32
    assert cfg.trainer.total_training_steps == 10
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
    assert cfg.trainer.default_local_dir == str((tmp_path / "ck pt" / "smoke").resolve())
    assert cfg.data.train_files == str((tmp_path / "data" / "small" / "train.parquet").resolve())
    assert settings.retrieval_urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def test_misspelled_override_key_fails_to_compose(compose, tmp_path):
    from hydra.errors import ConfigCompositionException

    overrides = render_overrides(TrainSettings(data_dir=tmp_path))
    typo = [o.replace("multi_turn.format=", "multi_turn.formt=") for o in overrides]
    assert typo != overrides
    with pytest.raises(ConfigCompositionException, match="formt"):
        compose(typo)


def test_misspelled_key_inside_a_config_section_fails_dataclass_conversion(compose, tmp_path):
    # hydra accepts a new key with "+"; verl's dataclass conversion is what catches it (DESIGN.md section 3).
    cfg = compose(
        [*render_overrides(TrainSettings(data_dir=tmp_path)), "+actor_rollout_ref.rollout.multi_turn.formt=x"]
    )
    from verl.utils.config import omega_conf_to_dataclass

    with pytest.raises(Exception, match="formt"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)


def test_override_keys_are_existing_and_unique(tmp_path, compose):
    # "+" only for keys verl's config does not declare (and reads anyway); every other key must already exist,
    # so compose (above) rejects a typo.
    added = {
        "+actor_rollout_ref.model.override_config.attn_implementation",
        "+reward.custom_reward_function.reward_kwargs.max_failure_rate",
        "+reward.custom_reward_function.reward_kwargs.failure_window",
        "+trainer.v1.sampler.sampler_kwargs.tokenizer",  # the sampler's loss-mask metrics (trainer/plugins/masks.py)
        VLLM_SYNC_KEY,  # the exact weight-sync check on vLLM (trainer/weight_sync/vllm_sync.py)
        FLASHINFER_SAMPLER_KEY,  # vLLM's native top-p sampler, no FlashInfer JIT at engine start
    }
    bare = compose([])
    from omegaconf import OmegaConf

    for line in render_overrides(TrainSettings(data_dir=tmp_path)):
        key = line.split("=", 1)[0]
        assert not key.startswith("~"), line
        if key.startswith("+"):
            assert key in added, line
            assert OmegaConf.select(bare, key[1:]) is None  # really absent from verl's config: "+" is needed
    keys = [line.split("=", 1)[0] for line in render_overrides(TrainSettings(data_dir=tmp_path))]
    assert len(keys) == len(set(keys)), "duplicate override keys"


def test_kl_zero_drops_the_reference_model(compose, tmp_path):
    cfg = compose(render_overrides(TrainSettings(data_dir=tmp_path, kl_coef=0)))
    _, use_ref, _ = _validated(cfg)
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False and use_ref is False


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        (True, "True"),
        (1e-6, "1e-06"),
        (["console", "wandb"], "[console,wandb]"),
        ("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct"),
        ("pkg://searchrl.trainer.plugins.reward", "pkg://searchrl.trainer.plugins.reward"),
        ("/a b/c", "'/a b/c'"),
        ("it's", "'it\\'s'"),
        ("null", "'null'"),
    ],
)
def test_hydra_value(value, rendered):
    assert hydra_value(value) == rendered


def test_main_ppo_command():
    cmd = main_ppo_command(TrainSettings(), python="/usr/bin/python3")
    assert cmd[:3] == ["/usr/bin/python3", "-m", "verl.trainer.main_ppo"]
    assert cmd[3:] == render_overrides(TrainSettings())
    assert all(isinstance(part, str) for part in cmd)


def test_verl_builds_the_policy_with_the_chosen_attention(compose, tmp_path, offline_tokenizer):
    """verl's own HFModelConfig (what the FSDP engine loads the model with) reads our attention override, set by
    FLASH_ATTN or by its older spelling attn_implementation."""
    from verl.utils.config import omega_conf_to_dataclass

    from searchrl.trainer.cpu.tiny_model import tiny_qwen2_config

    model = tmp_path / "model"
    tiny_qwen2_config(2048).save_pretrained(model)
    offline_tokenizer.save_pretrained(model)
    for switch, attn, remove_padding in (
        ({"flash_attn": False}, "sdpa", False),
        ({"flash_attn": True}, "flash_attention_2", True),
        ({"attn_implementation": "sdpa"}, "sdpa", False),
        ({"attn_implementation": "flash_attention_2"}, "flash_attention_2", True),
    ):
        settings = TrainSettings(data_dir=tmp_path, model_name=str(model), **switch)
        model_config = omega_conf_to_dataclass(compose(render_overrides(settings)).actor_rollout_ref.model)
        assert model_config.hf_config._attn_implementation == attn
        assert model_config.use_remove_padding is remove_padding


def test_smoke_dumps_rollouts_into_the_run(compose, tmp_path):
    settings = TrainSettings(data_dir=tmp_path, checkpoint_dir=tmp_path / "ck", smoke=True)
    cfg = compose(render_overrides(settings))
    assert cfg.trainer.rollout_data_dir == str((settings.run_dir / "rollouts").resolve())
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.total_training_steps, cfg.trainer.save_freq) == (1, 4, 2)
    assert "trainer.rollout_data_dir" not in " ".join(render_overrides(TrainSettings(data_dir=tmp_path)))


def test_sampling_and_entropy_defaults_are_search_r1s(compose, tmp_path):
    """Search-R1's verl fork: rollout top_p 0.95, entropy_coeff 0.001 (verl 0.9's own defaults: 1.0 and 0)."""
    cfg = compose(render_overrides(TrainSettings(_env_file=None, data_dir=tmp_path)))
    assert cfg.actor_rollout_ref.rollout.top_p == pytest.approx(0.95)
    assert cfg.actor_rollout_ref.actor.entropy_coeff == pytest.approx(0.001)
    # issue 46 item 1: at top_p 0.95 verl's default processed_logprobs are vLLM's nucleus-renormalised ones; the
    # rollout's log-probs the rollout/actor check reads are the full-vocabulary ones the actor computes (T=1)
    assert cfg.actor_rollout_ref.rollout.temperature == 1.0
    from verl.utils.config import omega_conf_to_dataclass

    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # what verl's vLLM server reads
    assert rollout.logprobs_mode == "raw_logprobs"


# --- the padded micro batch (issue 34 item 3) ---------------------------------------------------------------------


def _micro_batches(lengths: list[int], max_len: int, cfg) -> list[int]:
    """Padded tokens of each micro batch verl's own FSDP engine would run for one GPU's samples of these
    lengths under the composed actor config (verl/workers/engine/utils.py prepare_micro_batches; without padding
    removal each micro batch is padded to its longest sample, transformer_impl.py's NO_PADDING branch)."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    mask = torch.zeros(len(lengths), max_len, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    data = TensorDict({"input_ids": torch.ones_like(mask), "attention_mask": mask}, batch_size=[len(lengths)])
    actor = cfg.actor_rollout_ref.actor
    tu.assign_non_tensor_data(data, "use_dynamic_bsz", actor.use_dynamic_bsz)
    tu.assign_non_tensor_data(data, "max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu)
    tu.assign_non_tensor_data(data, "micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu)
    batches, _ = prepare_micro_batches(data)
    return [len(mb) * int(mb["attention_mask"].sum(dim=1).max()) for mb in batches]


def test_sdpa_micro_batches_are_bounded_by_the_token_budget_padding_included(compose, tmp_path):
    """Without padding removal, dynamic batching counted unpadded tokens: two 5,120-token trajectories among 300-token
    ones filled two micro batches of 18 rows each, padded to 92,160 tokens (9x the 10,240 budget; ~28 GB of bf16
    logits over Qwen2.5's 151,936-token vocabulary). Fixed micro batches of budget // max_seq_len rows cannot."""
    settings = TrainSettings(data_dir=tmp_path, nnodes=2, flash_attn=False, remove_padding="off")
    cfg = compose(render_overrides(settings))
    _validated(cfg)
    actor, ref, rollout = (
        cfg.actor_rollout_ref.actor,
        cfg.actor_rollout_ref.ref,
        cfg.actor_rollout_ref.rollout,
    )
    assert cfg.actor_rollout_ref.model.use_remove_padding is False
    budget, longest = actor.ppo_max_token_len_per_gpu, settings.max_seq_len
    assert (budget, longest) == (10_240, 5_120)
    assert actor.use_dynamic_bsz is False and ref.log_prob_use_dynamic_bsz is False
    assert rollout.log_prob_use_dynamic_bsz is False  # both log-prob passes, set with the actor's
    rows = budget // longest
    assert actor.ppo_micro_batch_size_per_gpu == ref.log_prob_micro_batch_size_per_gpu == rows == 2
    assert rollout.log_prob_micro_batch_size_per_gpu == rows
    worst = ([longest] + [300] * 17) * 2  # two full-length trajectories among short ones on one GPU
    assert max(_micro_batches(worst, longest, cfg)) <= budget  # rows x longest <= budget, padding included
    # the same samples under the old overrides (dynamic batching on): the risk, replayed with verl's code
    old = compose([*render_overrides(settings), "actor_rollout_ref.actor.use_dynamic_bsz=True"])
    assert max(_micro_batches(worst, longest, old)) == 92_160 == 18 * longest


def test_flash_attn_packs_every_pass_by_the_token_budget(compose, tmp_path):
    """The default (FLASH_ATTN=1): packed micro batches with dynamic batching by a per-GPU token budget for the
    update and for both log-prob passes (reference, old policy), read back from verl's composed config; verl's own
    prepare_micro_batches then packs one GPU's 2-node share into far fewer micro batches than 2-row padding."""
    settings = TrainSettings(data_dir=tmp_path, nnodes=2)
    cfg = compose(render_overrides(settings))
    _validated(cfg)
    model, actor = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor
    ref, rollout = cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.rollout
    assert model.override_config.attn_implementation == "flash_attention_2"
    assert (
        model.use_remove_padding is True and actor.use_remove_padding is True
    )  # the actor reads the model's
    budget = settings.token_budget_per_gpu
    assert budget == 10_240
    assert (actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu) == (True, budget)
    assert (ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu) == (True, budget)
    assert (rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu) == (True, budget)
    # one GPU's share of a mini batch: 256 prompts x 5 / 16 GPUs = 80 samples of mixed lengths
    lengths = [5_120, 300, 1_500, 800, 2_600] * 16
    packed = _micro_batches(lengths, 5_120, cfg)
    sdpa = compose(
        render_overrides(settings.model_copy(update={"flash_attn": False, "remove_padding": "off"}))
    )
    padded = _micro_batches(lengths, 5_120, sdpa)
    assert len(padded) == 40 and max(padded) <= budget  # 2 rows each (FLASH_ATTN=0, padded)
    assert len(packed) < 40 / 2


def test_a_share_that_does_not_split_into_micro_batches_is_refused(tmp_path):
    odd = dict(data_dir=tmp_path, train_batch_size=2, rollout_n=5, gpus_per_node=1)
    with pytest.raises(
        ValueError, match=r"share of a PPO mini batch \(5 samples\) must be a multiple of the micro"
    ):
        TrainSettings(**odd, flash_attn=False, remove_padding="off")
    packed = TrainSettings(
        **odd, flash_attn=False
    )  # sdpa, auto: padded rows cannot split 5 samples, packed micro batches can
    assert packed.removes_padding is True
    assert TrainSettings(data_dir=tmp_path, smoke=True).micro_batch_rows == 2  # the smoke run: 16 x 2 / 1 GPU


# --- FSDP inside a node on multi-node runs (issue 38 item 3) --------------------------------------------------------


@pytest.mark.parametrize("nnodes", [2, 4])
def test_multi_node_shards_inside_a_node_and_syncs_once_per_mini_batch(compose, tmp_path, nnodes):
    """verl's defaults shard over every GPU of every node (fsdp_size -1) and reduce gradients after every micro
    batch: each node then sends ~2.8 TB a step over the node link (trainer/step_cost.py). The overrides set one
    node's GPUs per FSDP group and one gradient sync per mini batch; verl's own config classes read them."""
    from verl.utils.config import omega_conf_to_dataclass

    settings = TrainSettings(data_dir=tmp_path, nnodes=nnodes, gpus_per_node=8)
    cfg = compose(render_overrides(settings))
    _validated(cfg)  # verl's validate_config passes
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # FSDPActorConfig: what the engine receives
    assert (
        actor.fsdp_config.fsdp_size == 8 and actor.fsdp_config.use_no_sync_for_gradient_accumulation is True
    )
    assert cfg.actor_rollout_ref.ref.fsdp_config.fsdp_size == 8  # the reference model too (forward only)
    # FSDP2, so the micro batches between syncs accumulate in fp32, not bf16 (tests/trainer/
    # test_grad_accumulation.py): the engine config verl's worker builds from (actor_config.engine) says so; the
    # reference model's strategy interpolates the actor's (verl's ref.yaml) into the same FSDPActorConfig class,
    # whose __post_init__ copies it into the engine config as it does for the actor
    assert (actor.strategy, actor.engine.strategy, cfg.actor_rollout_ref.ref.strategy) == ("fsdp2",) * 3


def test_the_one_node_rehearsal_composes_the_multi_node_fsdp_layout(compose, tmp_path):
    """REHEARSE_MULTI_NODE=1 on 1 x 8 GPUs (issue 53 item 4): FSDP2, no-sync and HSDP 2 x 4 inside the node, read
    by verl's own config classes; verl's mesh is then (ddp 2, fsdp 4) (engine/fsdp/utils.py create_device_mesh).
    Only those four rows differ from the one-node rendering, and without the switch nothing changes."""
    from verl.utils.config import omega_conf_to_dataclass

    plain = TrainSettings(data_dir=tmp_path)
    rehearsal = TrainSettings(data_dir=tmp_path, rehearse_multi_node=True)
    cfg = compose(render_overrides(rehearsal))
    _validated(cfg)  # verl's validate_config passes
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # FSDPActorConfig: what the engine receives
    assert (actor.strategy, actor.engine.strategy, cfg.actor_rollout_ref.ref.strategy) == ("fsdp2",) * 3
    assert actor.fsdp_config.use_no_sync_for_gradient_accumulation is True
    assert actor.fsdp_config.fsdp_size == 4 and cfg.actor_rollout_ref.ref.fsdp_config.fsdp_size == 4
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8)  # one node, its 8 GPUs
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    assert (world // actor.fsdp_config.fsdp_size, actor.fsdp_config.fsdp_size) == (2, 4)  # verl's (ddp, fsdp)
    changed = set(render_overrides(rehearsal)) ^ set(render_overrides(plain))
    assert {item.split("=", 1)[0] for item in changed} == {
        "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size",
        "actor_rollout_ref.ref.fsdp_config.fsdp_size",
        "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation",
    }
    off = TrainSettings(data_dir=tmp_path, rehearse_multi_node=False)
    assert render_overrides(off) == render_overrides(plain)
    # and the 2-node rendering is untouched: one node's 8 GPUs per group, as before the switch existed
    two = compose(render_overrides(TrainSettings(data_dir=tmp_path, nnodes=2)))
    assert (
        two.actor_rollout_ref.actor.fsdp_config.fsdp_size == 8
        and two.actor_rollout_ref.actor.strategy == "fsdp2"
    )


def test_the_rehearsal_on_four_gpus_is_the_engine_config_the_gloo_hsdp_test_runs(compose, tmp_path):
    """tests/trainer/test_fsdp_sync.py runs verl's FSDP engine on 4 gloo ranks from the actor config of 2 nodes x 2
    GPUs (HSDP 2 x 2, one sync per mini batch): a rehearsal on one node of 4 GPUs composes the same engine config,
    so that run (slow, ~90 s on 2 cores) covers the rehearsal's mesh and micro-batch loop as well."""
    from verl.utils.config import omega_conf_to_dataclass

    shape = {"data_dir": tmp_path, "train_batch_size": 8, "rollout_n": 4}
    engines = [
        omega_conf_to_dataclass(compose(render_overrides(s)).actor_rollout_ref.actor).fsdp_config
        for s in (
            TrainSettings(**shape, nnodes=2, gpus_per_node=2),  # test_fsdp_sync.py's settings
            TrainSettings(**shape, gpus_per_node=4, rehearse_multi_node=True),
        )
    ]
    assert engines[0] == engines[1]
    assert (engines[1].strategy, engines[1].fsdp_size, engines[1].use_no_sync_for_gradient_accumulation) == (
        "fsdp2",
        2,
        True,
    )


@pytest.mark.parametrize("rollout_name", ["vllm", "sglang"])
def test_our_agent_loop_keys_compose_in_their_own_engine_kwargs_block(compose, tmp_path, rollout_name):
    """verl's `rollout.engine_kwargs` is a free dict with one block per engine: our agent loop's turn cap goes into a
    block of its own (`+...engine_kwargs.searchrl.turn_max_tokens`, trainer/plugins/engine_kwargs.py), which composes
    onto a GPU run's overrides, survives verl's RolloutConfig, leaves the engine's block as it was and reads back.
    The GPU run's own overrides set no cap (verl's default: a turn may use the whole response budget)."""
    from verl.utils.config import omega_conf_to_dataclass

    from searchrl.trainer.plugins.agent_loop import turn_max_tokens
    from searchrl.trainer.plugins.engine_kwargs import SEARCHRL_KWARGS

    settings = TrainSettings(
        data_dir=tmp_path,
        rollout_name=rollout_name,
        model_name="meta-llama/Llama-3.2-3B-Instruct"
        if rollout_name == "sglang"
        else "Qwen/Qwen2.5-3B-Instruct",
    )
    gpu = render_overrides(settings)
    assert not [o for o in gpu if "engine_kwargs" in o]
    cfg = compose([*gpu, f"+{SEARCHRL_KWARGS}.turn_max_tokens=96"])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's RolloutConfig
    assert turn_max_tokens(cfg.actor_rollout_ref.rollout) == turn_max_tokens(rollout) == 96
    assert (
        rollout.engine_kwargs[rollout_name]
        == compose(gpu).actor_rollout_ref.rollout.engine_kwargs[rollout_name]
    )
    assert turn_max_tokens(compose(gpu).actor_rollout_ref.rollout) is None


@pytest.mark.parametrize("rollout_name", ["vllm", "sglang"])
def test_every_ray_process_of_a_gpu_run_registers_our_agent_loop(tmp_path, rollout_name):
    """The rows and default_agent_loop name `searchrl_tool_agent`; verl's agent-loop workers find it only if the
    module registering it was imported there. The run's VERL_USE_EXTERNAL_MODULES, given to a fresh Python that
    imports verl (as each Ray process does), registers it, with the class verl instantiates, and not the CPU runs'
    scripted subclass (trainer/cpu/scripted_agent_loop.py)."""
    import subprocess
    import sys

    line = next(
        o
        for o in render_overrides(
            TrainSettings(
                data_dir=tmp_path,
                rollout_name=rollout_name,
                # sglang 0.5.12 reads back Llama, not the default Qwen2 (trainer/weight_sync/sglang_readback.py)
                model_name="meta-llama/Llama-3.2-3B-Instruct"
                if rollout_name == "sglang"
                else "Qwen/Qwen2.5-3B-Instruct",
            )
        )
        if o.startswith(VLLM_SYNC_KEY)
    )
    value = line.split("=", 1)[1].strip("'")
    probe = (
        "import verl\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        "print(r['searchrl_tool_agent']['_target_'])\n"
        "print('searchrl_scripted_tool_agent' in r)\n"
        "from verl.workers.rollout.base import _ROLLOUT_REGISTRY as w\n"
        f"print(w[({rollout_name!r}, 'async')])"
    )
    env = {**__import__("os").environ, "VERL_USE_EXTERNAL_MODULES": value}
    env.pop("VERL_PLATFORM", None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loop, scripted, rollout = done.stdout.strip().splitlines()[-3:]
    assert loop == "searchrl.trainer.plugins.agent_loop.SearchToolAgentLoop" and scripted == "False"
    # and the weight-sync check of the run's engine (trainer/weight_sync/vllm_sync.py, trainer/weight_sync/sglang_sync.py)
    assert rollout == f"searchrl.trainer.weight_sync.{rollout_name}_classes.FingerprintServerAdapter"


def test_a_gpu_run_in_separate_async_installs_the_clone_guard_and_the_logger_fix_in_every_ray_process(
    tmp_path,
):
    """verl's saved old policy aliases the live weights wherever they sit on CPU (parameter offload on GPUs) and its
    separate_async trainer dies at start-up on a `flush=` kwarg (trainer/patches/old_policy_guard.py,
    trainer/patches/separate_async.py): a fresh Python given the run's VERL_USE_EXTERNAL_MODULES, as each Ray process
    is, has both patches; a sync run names neither module."""
    import subprocess
    import sys

    def modules(settings: TrainSettings) -> str:
        line = next(o for o in render_overrides(settings) if o.startswith(VLLM_SYNC_KEY))
        return line.split("=", 1)[1].strip("'")

    assert "old_policy_guard" not in modules(TrainSettings(data_dir=tmp_path))
    value = modules(TrainSettings(data_dir=tmp_path, nnodes=2, trainer_mode="separate_async"))
    probe = (
        "import logging, verl\n"
        "from verl.utils import fsdp_utils\n"
        "print(getattr(fsdp_utils.fsdp2_sharded_save_to_cpu, '_searchrl_clones_aliases', False),"
        " getattr(logging.getLogger('verl.trainer.ppo.v1.trainer_separate_async'), '_searchrl_drops_flush', False))"
    )
    env = {**__import__("os").environ, "VERL_USE_EXTERNAL_MODULES": value}
    env.pop("VERL_PLATFORM", None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True True"


# --- trainer modes (issue 40 item 1): verl's own config and its own trainer classes -----------------------------

MODES = ["sync", "colocate_async", "separate_async"]


def _verl_trainer(cfg):
    """verl's trainer class for the composed mode, built as main_ppo builds it (get_trainer_cls), no Ray.

    Its constructor runs the mode's own checks (separate_async: batch == parameter_sync_step x mini batch, a
    rollout pool, a checkpoint engine other than naive; trainer_separate_async.py) and PPOTrainer.__init__,
    which builds only the checkpoint callback and the replay buffer (ours, trainer/plugins/sampler.py).
    """
    from verl.trainer.ppo.v1 import get_trainer_cls

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Disabled critic", UserWarning)  # GRPO has no critic
        return get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_composes_and_verls_own_trainer_accepts_it(compose, tmp_path, mode):
    settings = TrainSettings(data_dir=tmp_path, nnodes=2, trainer_mode=mode)
    cfg = compose(render_overrides(settings))
    _validated(cfg)  # verl's validate_config over the whole config
    v1 = cfg.trainer.v1
    assert v1.trainer_mode == mode  # verl's literal names: its code tests == "sync" / != "sync"
    assert v1.sampler.custom_sampler.path == SAMPLER_PATH
    assert v1.sampler.custom_sampler.name == (SAMPLER_NAME if mode == "sync" else SAMPLER_ASYNC_NAME)
    assert (v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (2, "drop")
    assert cfg.data.get("gen_batch_size") is None  # verl forces 1 in the async modes; any other value warns
    trainer = _verl_trainer(cfg)
    assert (
        type(trainer).__name__
        == {
            "sync": "PPOTrainerSync",
            "colocate_async": "PPOTrainerColocateAsync",
            "separate_async": "PPOTrainerSeparateAsync",
        }[mode]
    )
    # each global step trains the whole batch: one update per mini batch, weights pushed after the last
    assert trainer.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size == (
        cfg.data.train_batch_size
        if mode == "separate_async"
        else cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    )
    if mode == "sync":
        assert type(trainer.replay_buffer).__name__ == SAMPLER_NAME
    else:
        from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

        assert type(trainer.replay_buffer).__name__ == SAMPLER_ASYNC_NAME
        assert isinstance(trainer.replay_buffer, ReplayBufferAsync)
        assert trainer.replay_buffer.max_off_policy_threshold == 2


def test_separate_async_trains_on_one_node_and_generates_on_the_other(compose, tmp_path):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose(render_overrides(TrainSettings(data_dir=tmp_path, nnodes=2, trainer_mode="separate_async")))
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.nnodes, rollout.n_gpus_per_node) == (1, 8)
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"  # one trainer node: a sync per micro batch, FSDP1
    assert cfg.actor_rollout_ref.hybrid_engine is False  # no rollout replicas on the trainer's GPUs
    assert cfg.trainer.v1.separate_async.parameter_sync_step == 2  # 512 / 256
    assert cfg.data.train_batch_size == 2 * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size == -1  # one trainer node: FSDP inside it
    engine = omega_conf_to_dataclass(rollout.checkpoint_engine)  # verl's CheckpointEngineConfig
    assert type(engine).__name__ == "CheckpointEngineConfig"
    assert (engine.backend, engine.custom_backend_module) == ("nccl", None)
    assert cfg.trainer.v1.separate_async.num_warmup_batches == 1.0


def test_a_cpu_separate_async_run_names_the_gloo_engine_and_its_module(compose, tmp_path):
    from verl.utils.config import omega_conf_to_dataclass

    from searchrl.trainer.proofs.train_cpu import GLOO_ENGINE, GLOO_ENGINE_MODULE

    settings = TrainSettings(
        data_dir=tmp_path,
        nnodes=2,
        gpus_per_node=1,
        train_batch_size=4,
        rollout_n=2,
        trainer_mode="separate_async",
        checkpoint_engine=GLOO_ENGINE,
        checkpoint_engine_module=GLOO_ENGINE_MODULE,
    )
    cfg = compose(render_overrides(settings))
    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
    assert (engine.backend, engine.custom_backend_module) == ("gloo", "searchrl.trainer.cpu.gloo_engine")
    assert (
        cfg.trainer.nnodes,
        cfg.actor_rollout_ref.rollout.nnodes,
        cfg.trainer.v1.separate_async.parameter_sync_step,
    ) == (1, 1, 2)
    _verl_trainer(cfg)  # verl's own checks accept it


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        (
            "trainer.v1.separate_async.parameter_sync_step=4",
            "train_batch_size must equal parameter_sync_step",
        ),
        ("actor_rollout_ref.rollout.nnodes=0", "nnodes must be > 0"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=naive", "please use nccl"),
    ],
)
def test_verls_separate_async_checks_run_on_our_config(compose, tmp_path, override, refusal):
    """The constructor above is a real check: verl's own assertions refuse each predicate broken alone."""
    base = render_overrides(TrainSettings(data_dir=tmp_path, nnodes=2, trainer_mode="separate_async"))
    cfg = compose(merge_overrides(base, [override]))
    with pytest.raises(AssertionError, match=refusal):
        _verl_trainer(cfg)


@pytest.mark.parametrize("mode", MODES)
def test_verl_loads_an_async_replay_buffer_exactly_in_the_async_modes(mode):
    """verl loads a custom sampler by name whatever the mode (trainer_base.py _build_replay_buffer): a sync class
    in an async mode would train without stale-sample eviction, silently."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.utils.import_utils import load_extern_type

    name = SAMPLER_NAME if mode == "sync" else SAMPLER_ASYNC_NAME
    assert issubclass(load_extern_type(SAMPLER_PATH, name), ReplayBufferAsync) is (mode != "sync")


@pytest.mark.parametrize("rollout", ["vllm", "sglang"])
def test_vllms_workers_start_with_flashinfers_sampler_off_and_ray_accepts_it(tmp_path, compose, rollout):
    """Issue 53 item 1: the rendered run hands VLLM_USE_FLASHINFER_SAMPLER=0 to every Ray worker through verl's own
    runtime-env merge (verl/trainer/main_ppo.py run_ppo: get_ppo_ray_runtime_env, then ray_init.runtime_env over
    it), as a string Ray's runtime-env schema takes (an unquoted 0 composes to an int, which Ray refuses). vLLM's
    rule on that value is tests/trainer/test_flashinfer_sampler.py."""
    from ray.runtime_env import RuntimeEnv

    from tests.trainer.conftest import worker_env_vars

    model = "meta-llama/Llama-3.2-3B-Instruct" if rollout == "sglang" else "Qwen/Qwen2.5-3B-Instruct"
    settings = TrainSettings(data_dir=tmp_path, rollout_name=rollout, model_name=model)
    env_vars = worker_env_vars(compose, settings)
    assert env_vars.get("VLLM_USE_FLASHINFER_SAMPLER") == ("0" if rollout == "vllm" else None)
    with pytest.raises(TypeError):
        RuntimeEnv(env_vars={"VLLM_USE_FLASHINFER_SAMPLER": 0})  # why hydra_value quotes a numeric string
    assert hydra_value("0") == "'0'" and hydra_value(0) == "0" and hydra_value("inf") == "'inf'"
