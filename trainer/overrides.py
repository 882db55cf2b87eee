"""TrainSettings -> the hydra overrides for `python -m verl.trainer.main_ppo` (a pure function).

Run: `searchrl train overrides` prints them one per line (`mapfile -t ARGS < <(searchrl train overrides)`).
tests/trainer/test_overrides.py composes them with verl's own `ppo_trainer` config, so a misspelled key fails a
test instead of a GPU job. The ones that decide whether the model ever searches (../shared/DESIGN.md section 3):
`rollout.name=sglang|vllm`, `multi_turn.enable=True`, `multi_turn.format=hermes`, `multi_turn.tool_config_path`,
`agent.default_agent_loop=searchrl_tool_agent` (verl's ToolAgentLoop plus the record of what the rollout server
generated, trainer/plugins/agent_loop.py), `max_tool_response_length` sized to top-k passages (verl's default 256
characters would cut every observation to a stub), and `data.return_raw_chat=True`. Resume needs
`resume_mode=auto`, `save_freq>0`, `max_actor_ckpt_to_keep>=2` and a per-experiment `default_local_dir`.
`trainer.total_epochs` comes from the train rows (TrainSettings.epochs_for), because verl stops at
epochs x steps-per-epoch whatever `total_training_steps` says. Keys verl's config does not declare are added
with hydra's `+` (the attention override, the reward function's kwargs, the modules every Ray process imports:
our agent loop, and on vLLM the weight-sync plugin).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from searchrl.chat_template import CHATML_HERMES_TEMPLATE
from searchrl.trainer.engines import SYNC_PLUGINS
from searchrl.trainer.settings import TrainSettings

# Where verl finds our reward function: an importable module, so it works on every Ray node without paths.
REWARD_FN_PATH = "pkg://searchrl.trainer.plugins.reward"
REWARD_FN_NAME = "compute_score"
# verl's sync trainer, by its own name: verl compares the mode with the literal "sync" (trainer/plugins/sampler.py).
# The default of TrainSettings.trainer_mode; the async modes are rendered by render_mode_overrides.
TRAINER_MODE = "sync"
# Its replay buffer plus a stop on failed rollout groups and per-step search metrics (trainer/plugins/sampler.py).
SAMPLER_PATH = "pkg://searchrl.trainer.plugins.sampler"
SAMPLER_NAME = "SearchReplayBuffer"
# The async modes' replay buffer (verl's ReplayBufferAsync with the same stop and metrics, trainer/plugins/sampler.py):
# verl loads a custom sampler by name whatever the mode (trainer_base.py _build_replay_buffer), so a sync class
# named here would run an async trainer without stale-sample eviction.
SAMPLER_ASYNC_NAME = "SearchReplayBufferAsync"
# Modules every Ray process imports at `import verl` (comma-separated, verl/__init__.py): our agent loop, which
# registers `searchrl_tool_agent` where verl's agent-loop workers look it up (trainer/plugins/agent_loop.py), and the
# weight-sync check of the rollout engine (vLLM: trainer/weight_sync/vllm_sync.py; sglang: trainer/weight_sync/sglang_sync.py).
AGENT_LOOP_PLUGIN = "searchrl.trainer.plugins.agent_loop"
# verl's console step line ends with a marker, so one Ray forwarded in pieces is joined (trainer/patches/step_line.py)
STEP_LINE_PLUGIN = "searchrl.trainer.patches.step_line"
VLLM_SYNC_PLUGIN = SYNC_PLUGINS["vllm"]
# separate_async: the old-policy clone guard (with parameter offload verl's saved pi_old is the live weights) and the
# fix for its trainer's start-up TypeError (trainer/patches/old_policy_guard.py, trainer/patches/separate_async.py).
SEPARATE_ASYNC_PLUGINS = (
    "searchrl.trainer.patches.old_policy_guard",
    "searchrl.trainer.patches.separate_async",
)
SGLANG_SYNC_PLUGIN = SYNC_PLUGINS["sglang"]
VLLM_SYNC_KEY = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
# vLLM 0.24.0 binds its top-k/top-p sampler to FlashInfer on CUDA with raw log-probs unless this is 0
# (vllm/v1/sample/ops/topk_topp_sampler.py:21-66 `flashinfer_sampler_supported`, :86-95), and the engine's profile
# and warm-up runs (v1/worker/gpu_model_runner.py `_dummy_sampler_run`) then JIT-build FlashInfer's sampling module
# with nvcc (flashinfer/jit/sampling.py): the lock has no flashinfer-jit-cache and its nvcc is not on PATH, so every
# engine start would die in verl's init on an image without a CUDA toolkit, or compile for minutes on one with it
# (vllm-project/vllm#49497). At 0, vLLM takes its native top-k/top-p path (`forward_native`), raw log-probs
# unchanged. verl's main_ppo merges ray_init.runtime_env into the job's runtime env, which every Ray worker on every
# node starts with, the hybrid workers that build vLLM's model runner and sampler included.
FLASHINFER_SAMPLER_KEY = "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_FLASHINFER_SAMPLER"

# Values hydra's override grammar accepts unquoted; anything else is single-quoted.
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_./:+\-~@]+$")


def hydra_value(value: object) -> str:
    """Render a Python value in hydra override syntax (bools capitalised, odd strings quoted)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if (
        _PLAIN_VALUE.match(text)
        and text.lower() not in {"true", "false", "null", "none"}
        and not _numeric(text)
    ):
        return text
    # hydra's quoted strings take a backslash literally unless it precedes a quote (or ends the string): only
    # those runs are doubled, so a Jinja template's `\\n` survives (escaping every backslash doubled them)
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"


def _numeric(text: str) -> bool:
    """A string hydra would read as a number (`0`, `1e3`, `inf`) unless quoted: a Ray env var must stay a string."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _abs(path: Path) -> str:
    # Absolute, because verl's Ray workers do not share the launcher's working directory.
    return str(path.expanduser().resolve())


def render_overrides(settings: TrainSettings, train_rows: int | None = None) -> list[str]:
    """The full override list for one GRPO search-agent run, in a stable order.

    `train_rows` is the prepared train split's size (launch knows it); None reads it from an earlier data prep
    or the dataset size (TrainSettings.expected_train_rows).
    """
    s = settings
    r = s.rollout  # the episode rules eval shares (searchrl/rollout.py)
    use_kl = s.kl_coef > 0
    total_epochs = s.epochs_for(s.expected_train_rows() if train_rows is None else train_rows)
    # verl's FSDP engine reads attn_implementation from model.override_config (default flash_attention_2):
    # flash-attn 2 by default (FLASH_ATTN=1; its wheel is installed after the lock on the GPU nodes), sdpa with
    # FLASH_ATTN=0. Packed micro batches (use_remove_padding) go with dynamic batching by a per-GPU token budget,
    # set for the update and for both log-prob passes (reference, old policy). Padded micro batches are padded to
    # their longest sample, which dynamic batching (unpadded token counts) does not bound: there micro batches
    # are fixed at TrainSettings.micro_batch_rows, so rows x longest <= the token budget (docs/training.md).
    packed = s.removes_padding
    micro = s.micro_batch_size_per_gpu if packed else s.micro_batch_rows
    budget = s.token_budget_per_gpu
    pairs: list[tuple[str, object]] = [
        # --- algorithm: GRPO, KL as a loss term (Search-R1), not in the reward
        ("algorithm.adv_estimator", "grpo"),
        ("algorithm.use_kl_in_reward", False),
        # --- data
        ("data.train_files", _abs(s.train_file)),
        ("data.val_files", _abs(s.test_file)),
        ("data.train_batch_size", s.train_batch_size),
        ("data.max_prompt_length", r.max_prompt_tokens),
        ("data.max_response_length", r.max_response_tokens),
        ("data.filter_overlong_prompts", True),
        ("data.truncation", "error"),
        ("data.return_raw_chat", True),
        ("data.shuffle", True),
        ("data.seed", s.seed),
        ("data.val_max_samples", s.val_max_samples),
        ("data.val_batch_size", s.val_batch_size),
        # --- policy model and optimiser
        ("actor_rollout_ref.model.path", s.model_name),
        ("+actor_rollout_ref.model.override_config.attn_implementation", s.attention),
        ("actor_rollout_ref.model.use_remove_padding", packed),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
        ("actor_rollout_ref.actor.optim.lr", s.lr),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", s.lr_warmup_ratio),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", micro),
        ("actor_rollout_ref.actor.use_dynamic_bsz", packed),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", budget),
        ("actor_rollout_ref.actor.use_kl_loss", use_kl),
        ("actor_rollout_ref.actor.kl_loss_coef", s.kl_coef),
        ("actor_rollout_ref.actor.kl_loss_type", s.kl_loss_type),
        ("actor_rollout_ref.actor.entropy_coeff", s.entropy_coeff),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", micro),
        # verl interpolates these two from the actor's; set here so the budget is ours whatever verl's defaults
        ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", packed),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", budget),
        ("actor_rollout_ref.ref.fsdp_config.param_offload", True),
        # multi-node: FSDP inside each node, one gradient sync per mini batch (TrainSettings.fsdp_size), on FSDP2,
        # which accumulates the unsynced micro batches in fp32 where FSDP1 sums them in bf16
        # (TrainSettings.fsdp_strategy; the reference model follows actor.strategy, verl's ref.yaml). The same rows
        # on one node with REHEARSE_MULTI_NODE=1, as HSDP 2 x GPUS_PER_NODE / 2 inside it
        ("actor_rollout_ref.actor.strategy", s.fsdp_strategy),
        ("actor_rollout_ref.actor.fsdp_config.fsdp_size", s.fsdp_size),
        ("actor_rollout_ref.ref.fsdp_config.fsdp_size", s.fsdp_size),
        (
            "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation",
            s.sync_grads_per_mini_batch,
        ),
        # --- rollout: an async engine, the multi-turn tool loop, hermes tool calls
        ("actor_rollout_ref.rollout.name", s.rollout_name),
        ("actor_rollout_ref.rollout.mode", "async"),
        ("actor_rollout_ref.rollout.n", s.rollout_n),
        ("actor_rollout_ref.rollout.temperature", s.temperature),
        ("actor_rollout_ref.rollout.top_p", s.top_p),
        # the rollout's log-probs with the actor's semantics (full vocabulary), so verl's rollout/actor check
        # compares like with like (TrainSettings.rollout_logprobs_mode says why)
        ("actor_rollout_ref.rollout.logprobs_mode", s.rollout_logprobs_mode),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", s.rollout_tp),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", s.gpu_memory_utilization),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", micro),
        ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", packed),
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", budget),
        ("actor_rollout_ref.rollout.multi_turn.enable", True),
        ("actor_rollout_ref.rollout.multi_turn.format", "hermes"),
        ("actor_rollout_ref.rollout.multi_turn.tool_config_path", _abs(s.resolved_tool_config_path)),
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", r.max_assistant_turns),
        ("actor_rollout_ref.rollout.multi_turn.max_user_turns", r.max_turns),
        ("actor_rollout_ref.rollout.multi_turn.max_parallel_calls", r.max_parallel_calls),
        ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", r.observation_chars),
        ("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side", "right"),
        ("actor_rollout_ref.rollout.agent.default_agent_loop", s.agent_loop),
        # --- reward: our EM scorer for every data source
        ("reward.custom_reward_function.path", REWARD_FN_PATH),
        ("reward.custom_reward_function.name", REWARD_FN_NAME),
        ("+reward.custom_reward_function.reward_kwargs.max_failure_rate", s.max_search_failure_rate),
        ("+reward.custom_reward_function.reward_kwargs.failure_window", s.search_failure_window),
        # --- trainer: cluster shape, schedule, checkpoints that survive preemption
        ("trainer.project_name", s.project_name),
        ("trainer.experiment_name", s.experiment_name),
        ("trainer.logger", s.loggers),
        ("trainer.nnodes", s.trainer_nodes),  # separate_async: the rollout nodes are a pool of their own
        ("trainer.n_gpus_per_node", s.gpus_per_node),
        ("trainer.total_training_steps", s.total_steps),
        ("trainer.total_epochs", total_epochs),
        ("trainer.save_freq", s.save_freq),
        ("trainer.test_freq", s.test_freq),
        ("trainer.val_before_train", s.val_before_train),
        ("trainer.critic_warmup", 0),
        ("trainer.resume_mode", "auto"),
        ("trainer.max_actor_ckpt_to_keep", s.max_ckpt_to_keep),
        ("trainer.default_local_dir", _abs(s.run_dir)),
        # --- verl's trainer mode; our replay buffer stops on a failed group and logs search/* per step
        *mode_pairs(s),
        ("trainer.v1.sampler.custom_sampler.path", SAMPLER_PATH),
        # its loss-mask metrics read the response tokens' strings (trainer/plugins/masks.py)
        ("+trainer.v1.sampler.sampler_kwargs.tokenizer", s.model_name),
    ]
    if s.rollout_data_dir is not None:
        pairs.append(("trainer.rollout_data_dir", _abs(s.rollout_data_dir)))
    # after every sync the rollout reports what it holds and the trainer compares (vLLM: the workers' fingerprints,
    # trainer/weight_sync/vllm_sync.py; sglang: a block of every tensor read back by name, trainer/weight_sync/sglang_sync.py)
    sync_plugin = SYNC_PLUGINS.get(s.rollout_name)
    plugins = [AGENT_LOOP_PLUGIN, STEP_LINE_PLUGIN, *([sync_plugin] if sync_plugin else [])]
    if s.trainer_mode == "separate_async":
        plugins += SEPARATE_ASYNC_PLUGINS
    pairs.append((VLLM_SYNC_KEY, ",".join(plugins)))
    if s.rollout_name == "vllm":
        pairs.append((FLASHINFER_SAMPLER_KEY, "0"))  # a string: Ray takes only strings as env vars
    if s.chat_template == "searchrl":
        # verl's agent loop renders every prompt with it (trainer/template_check.py checked it fits the tokenizer)
        pairs.append(("actor_rollout_ref.model.custom_chat_template", CHATML_HERMES_TEMPLATE))
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


def mode_pairs(settings: TrainSettings) -> list[tuple[str, object]]:
    """verl's trainer.v1 mode and what each mode needs (docs/training.md "Trainer modes").

    Every mode names its sampler class and the staleness bound (verl's sync trainer ignores the bound). The async
    modes leave data.gen_batch_size unset: verl forces it to 1 there (one prompt per dataloader fetch) and warns
    about any other value. separate_async: the trainer keeps NUM_NODES - ROLLOUT_NODES nodes (trainer.nnodes,
    set with the cluster shape), the rollout pool the rest with no rollout replicas on the trainer's GPUs
    (hybrid_engine=False), weights pushed once per step over a checkpoint engine after parameter_sync_step local
    updates (verl asserts batch == parameter_sync_step x mini batch and a backend other than naive).
    """
    s = settings
    pairs: list[tuple[str, object]] = [
        ("trainer.v1.trainer_mode", s.trainer_mode),
        (
            "trainer.v1.sampler.custom_sampler.name",
            SAMPLER_NAME if s.trainer_mode == "sync" else SAMPLER_ASYNC_NAME,
        ),
        ("trainer.v1.sampler.max_off_policy_threshold", s.max_off_policy_threshold),
        ("trainer.v1.sampler.max_off_policy_strategy", s.max_off_policy_strategy),
    ]
    if s.trainer_mode == "colocate_async":
        pairs.append(("trainer.v1.colocate_async.num_warmup_batches", s.num_warmup_batches))
    if s.trainer_mode == "separate_async":
        pairs += [
            ("trainer.v1.separate_async.num_warmup_batches", s.num_warmup_batches),
            ("trainer.v1.separate_async.parameter_sync_step", s.parameter_sync_step),
            ("actor_rollout_ref.hybrid_engine", False),
            ("actor_rollout_ref.rollout.nnodes", s.rollout_node_count),
            ("actor_rollout_ref.rollout.n_gpus_per_node", s.gpus_per_node),
            ("actor_rollout_ref.rollout.checkpoint_engine.backend", s.checkpoint_engine),
        ]
        if s.checkpoint_engine_module is not None:
            pairs.append(
                (
                    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
                    s.checkpoint_engine_module,
                )
            )
    return pairs


def merge_overrides(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """`base` with every key that `extra` sets replaced, then `extra` (hydra refuses a key given twice)."""
    keys = {item.split("=", 1)[0].lstrip("+") for item in extra}
    return [item for item in base if item.split("=", 1)[0].lstrip("+") not in keys] + list(extra)


def main_ppo_command(
    settings: TrainSettings, python: str = "python", train_rows: int | None = None
) -> list[str]:
    """argv for verl's trainer with our overrides (run without a shell: no quoting issues)."""
    return verl_command(render_overrides(settings, train_rows), python)


def verl_command(overrides: Sequence[str], python: str = "python") -> list[str]:
    """argv for verl's trainer entry point with these overrides (GPU run, CPU run and tests alike)."""
    return [python, "-m", "verl.trainer.main_ppo", *overrides]


__all__ = [
    "AGENT_LOOP_PLUGIN",
    "FLASHINFER_SAMPLER_KEY",
    "SGLANG_SYNC_PLUGIN",
    "SYNC_PLUGINS",
    "REWARD_FN_NAME",
    "REWARD_FN_PATH",
    "SAMPLER_ASYNC_NAME",
    "SEPARATE_ASYNC_PLUGINS",
    "SAMPLER_NAME",
    "SAMPLER_PATH",
    "TRAINER_MODE",
    "hydra_value",
    "main_ppo_command",
    "merge_overrides",
    "mode_pairs",
    "verl_command",
    "render_overrides",
]
