"""TrainSettings: every knob of a search-agent GRPO run, from flags > env > .env > defaults.

Defaults are the Search-R1 recipe (../shared/DESIGN.md section 6; arXiv 2503.09516): Qwen2.5-3B-Instruct, GRPO
with n=5 samples per prompt, batch 512, lr 1e-6 (warm-up ratio 0.285), KL loss 0.001 (low_var_kl), top-3
passages, up to 4 searches per answer, 1005 steps.

Env names are SEARCHRL_TRAIN_<FIELD>, except those users know from the SkyPilot recipes (DATASET_SIZE,
MODEL_NAME, TRAIN_BATCH_SIZE, TOTAL_STEPS, NUM_NODES, GPUS_PER_NODE, RETRIEVAL_SERVICE_URL, EXPERIMENT_NAME,
CHECKPOINT_DIR, ROLLOUT_N, MAX_TURNS, ROLLOUT, SMOKE, ALLOW_SMALL_CORPUS, FLASH_ATTN, TRAINER_MODE, ROLLOUT_NODES,
REHEARSE_MULTI_NODE), which are declared as aliases so `sky launch --env NAME=...` reaches them.

SMOKE=1 is the first GPU run (`make train-smoke`): SMOKE_PRESET below replaces every default it names (a value
the user sets still wins), so a tiny model trains for a few steps on one GPU against the bundled corpus.
A misspelled SEARCHRL_TRAIN_* key (environment or `.env`), or an unknown keyword argument, is an error; other
areas' variables in a shared `.env` are ignored.
The retrieval token is never a setting: only the *name* of the environment variable that holds it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from searchrl.config import StrictSettings, area_config
from searchrl.errors import ConfigError
from searchrl.retrieval import client
from searchrl.retrieval.client.corpus_check import SEARCH_R1_DATASET
from searchrl.rollout import MAX_TOPK, ROLLOUT_DEFAULTS, RolloutSpec
from searchrl.trainer.engines import RolloutName
from searchrl.trainer.node.flash_switch import flash_attn_on
from searchrl.urls import redact_url, scheme_problem, split_urls

DatasetSize = Literal["small", "medium", "full"]
# verl 0.9.1's trainer modes under the same entry point (trainer.v1.trainer_mode), by verl's own literal names:
# verl tests `== "sync"` / `!= "sync"` throughout trainer_base.py, so a renamed value would change behaviour.
TrainerMode = Literal["sync", "colocate_async", "separate_async"]
# (train rows, test rows) per size; None = every row (full: 169,615 train / 51,713 test, Search-R1's splits).
DATASET_SIZES: dict[str, tuple[int | None, int | None]] = {
    "small": (1_000, 200),
    "medium": (10_000, 2_000),
    "full": (None, None),
}
# Rows in PeterJinGo/nq_hotpotqa_train's train split (what `full` reads), for step arithmetic before data prep.
FULL_TRAIN_ROWS = 169_615
KNOWN_LOGGERS = frozenset({"console", "wandb", "mlflow", "swanlab", "tensorboard", "trackio", "clearml"})


def _alias(env_name: str, field: str) -> AliasChoices:
    return AliasChoices(env_name, f"SEARCHRL_TRAIN_{field.upper()}")


class TrainSettings(StrictSettings):
    model_config = area_config("SEARCHRL_TRAIN_")

    # --- data ------------------------------------------------------------------------------------------------
    dataset_size: DatasetSize = Field(default="full", validation_alias=_alias("DATASET_SIZE", "dataset_size"))
    # HF dataset repo id, or a local parquet/JSONL file (question, golden_answers, data_source), or a folder
    # holding train.{parquet,jsonl} and test.{parquet,jsonl}
    qa_source: str = SEARCH_R1_DATASET
    data_dir: Path = Path("data/train")  # verl parquet goes to <data_dir>/<dataset_size>/{train,test}.parquet
    seed: int = 42  # sampling of small/medium subsets and verl's data shuffle

    # --- model and GRPO --------------------------------------------------------------------------------------
    model_name: str = Field(
        default="Qwen/Qwen2.5-3B-Instruct", validation_alias=_alias("MODEL_NAME", "model_name")
    )  # HF id or local folder
    # "searchrl" trains with the repo's ChatML/hermes tool template (searchrl/chat_template.py) in place of the
    # model's own, for models whose template drops tools=; `searchrl train` refuses such a template otherwise
    chat_template: Literal["model", "searchrl"] = Field(
        default="model", validation_alias=_alias("CHAT_TEMPLATE", "chat_template")
    )
    train_batch_size: int = Field(
        default=512, ge=1, validation_alias=_alias("TRAIN_BATCH_SIZE", "train_batch_size")
    )  # prompts per step
    ppo_mini_batch_size: int | None = Field(default=None, ge=1)  # prompts per update; None = batch // 2 (256)
    micro_batch_size_per_gpu: int = Field(
        default=8, ge=1
    )  # most samples per padded micro batch (actor, ref, rollout); packed ones are sized by tokens
    max_token_len_per_gpu: int | None = Field(
        default=None, ge=1
    )  # tokens per GPU per micro batch (update and both log-prob passes; padding counts when padded); None = 2 x L
    rollout_n: int = Field(
        default=5, ge=1, validation_alias=_alias("ROLLOUT_N", "rollout_n")
    )  # GRPO group size
    lr: float = Field(default=1e-6, gt=0)  # actor learning rate
    lr_warmup_ratio: float = Field(default=0.285, ge=0, le=1)  # Search-R1 train_grpo.sh
    kl_coef: float = Field(default=0.001, ge=0)  # KL loss coefficient (0 disables the reference model)
    kl_loss_type: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"] = "low_var_kl"
    # Search-R1's values (its verl fork's ppo_trainer.yaml: entropy_coeff 0.001, rollout top_p 0.95; verl 0.9's
    # defaults are 0 and 1.0); docs/training.md "Defaults against Search-R1" lists every difference that remains.
    entropy_coeff: float = Field(default=0.001, ge=0)
    temperature: float = Field(default=1.0, gt=0)  # rollout sampling temperature (validation is greedy)
    top_p: float = Field(default=0.95, gt=0, le=1)  # rollout nucleus sampling (validation is greedy)
    total_steps: int = Field(default=1005, ge=1, validation_alias=_alias("TOTAL_STEPS", "total_steps"))
    # None = enough epochs for total_steps from the train rows (see epochs_for); a set value must reach total_steps
    total_epochs: int | None = Field(default=None, ge=1)

    # --- multi-turn search -----------------------------------------------------------------------------------
    max_turns: int = Field(
        default=ROLLOUT_DEFAULTS.max_turns, ge=1, validation_alias=_alias("MAX_TURNS", "max_turns")
    )  # searches/answer
    # The budgets below are shared with eval: defaults from searchrl/rollout.py, see `rollout` (issue 12).
    max_prompt_length: int = Field(
        default=ROLLOUT_DEFAULTS.max_prompt_tokens, ge=64
    )  # tokens: chat template + tool schema + question
    max_response_length: int = Field(
        default=ROLLOUT_DEFAULTS.max_response_tokens, ge=64
    )  # tokens for the whole trajectory incl. observations
    topk: int = Field(default=ROLLOUT_DEFAULTS.topk, ge=1, le=MAX_TOPK)  # passages per query
    passage_max_chars: int = Field(
        default=ROLLOUT_DEFAULTS.passage_max_chars, ge=50
    )  # cap per passage text (100-word wiki-18 ~ 600 chars)

    # --- rollout engine and cluster --------------------------------------------------------------------------
    rollout_name: RolloutName = Field(
        default="vllm", validation_alias=_alias("ROLLOUT", "rollout_name")
    )  # the locked engine: vllm resolves as published; sglang needs a transformers override (requirements/)
    # FSDP actor/reference attention. FLASH_ATTN is the one switch, read by trainer/node/flash_switch.py here and
    # for sky/train*.yaml and the Makefile (which install the wheel or not): 1 = flash-attn 2 (requirements/
    # gpu-flash-attn-py3XX.txt, installed after the lock on the GPU nodes), packed micro batches with a token
    # budget; 0 = torch's sdpa, nothing extra installed.
    flash_attn: bool = Field(default=True, validation_alias=_alias("FLASH_ATTN", "flash_attn"))
    # The same switch spelled as verl's value (SEARCHRL_TRAIN_ATTN_IMPLEMENTATION, kept for older commands): given
    # alone it sets flash_attn; contradicting an explicit FLASH_ATTN is an error. It is folded into flash_attn by
    # validation (None afterwards), so nothing can read a stale copy: use `attention` for verl's value.
    attn_implementation: Literal["sdpa", "flash_attention_2"] | None = None
    # Packed micro batches (verl's use_remove_padding + dynamic batching) under sdpa (FLASH_ATTN=0): auto = the
    # cheaper ESTIMATED step of padded and packed (trainer/step_cost.py choose_packing, printed by the launch plan);
    # on/off force it. flash-attn always packs.
    remove_padding: Literal["auto", "on", "off"] = "auto"
    # verl's agent loop for every row (the parquet's agent_name and rollout.agent.default_agent_loop): ours, verl's
    # ToolAgentLoop recording the tokens the server generated for the mask invariant (trainer/plugins/agent_loop.py)
    agent_loop: str = Field(default="searchrl_tool_agent", pattern=r"^[A-Za-z0-9_]+$")
    rollout_tp: int = Field(default=1, ge=1)  # tensor parallel size of the rollout engine
    gpu_memory_utilization: float = Field(default=0.6, gt=0, lt=1)  # KV-cache share of rollout GPU memory
    nnodes: int = Field(default=1, ge=1, validation_alias=_alias("NUM_NODES", "nnodes"))
    gpus_per_node: int = Field(default=8, ge=1, validation_alias=_alias("GPUS_PER_NODE", "gpus_per_node"))
    # 1 = rehearse the multi-node trainer on one node (issue 53): FSDP2, one gradient sync per mini batch (fp32
    # accumulator) and HSDP as 2 replicas x GPUS_PER_NODE / 2 inside the node, what NUM_NODES > 1 renders across
    # nodes (fsdp_size, sync_grads_per_mini_batch); NUM_NODES=1 and an even GPUS_PER_NODE of 4 or more only
    rehearse_multi_node: bool = Field(
        default=False, validation_alias=_alias("REHEARSE_MULTI_NODE", "rehearse_multi_node")
    )

    # --- trainer mode (verl's trainer.v1; docs/training.md "Trainer modes") ----------------------------------
    # sync: generate a batch, then update (Search-R1's schedule). colocate_async: rollout and actor share the GPUs
    # and generation runs on across updates. separate_async: the last ROLLOUT_NODES nodes only generate, the others
    # only train, and weights are pushed over a checkpoint engine once per step.
    trainer_mode: TrainerMode = Field(default="sync", validation_alias=_alias("TRAINER_MODE", "trainer_mode"))
    # Staleness bound of the async modes (verl's trainer.v1.sampler.max_off_policy_threshold): a trajectory whose
    # prompt was issued more than K-1 weight versions before the step that trains on it is dropped (or waited
    # for). verl's default is 8; ours is 2 = at most one update of lag. Nothing corrects for the lag unless
    # algorithm.rollout_correction is set, and a search trajectory is a long chain of the policy's own decisions
    # (whether to search, what to query, when to answer), so the bound is kept at the smallest that still lets
    # generation run across an update. Unused by sync.
    max_off_policy_threshold: int = Field(default=2, ge=1)
    # drop: a trajectory over the bound is discarded (its generation time is lost); wait: the step waits for it
    max_off_policy_strategy: Literal["drop", "wait"] = "drop"
    # Batches of prompts dispatched before the first async step (fractions allowed, verl rounds down)
    num_warmup_batches: float = Field(default=1.0, ge=0)
    # separate_async only: nodes that serve rollout alone (the rest train); 0 = one node (the only choice on the
    # default 2-node launch, and FSDP then stays inside the trainer node)
    rollout_nodes: int = Field(default=0, ge=0, validation_alias=_alias("ROLLOUT_NODES", "rollout_nodes"))
    # separate_async's weight transfer (verl's rollout.checkpoint_engine): nccl on GPUs; a CPU run names gloo and
    # the module that registers it (checkpoint_engine_module); verl refuses "naive" (in-process) in this mode
    checkpoint_engine: str = Field(default="nccl", pattern=r"^[A-Za-z0-9_]+$")
    checkpoint_engine_module: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")

    # --- checkpoints, validation, logging --------------------------------------------------------------------
    project_name: str = "searchrl"  # tracker project (W&B)
    experiment_name: str = Field(
        default="", validation_alias=_alias("EXPERIMENT_NAME", "experiment_name")
    )  # "" = search-r1-<model>-<size>-<steps>steps, so smoke and full runs never share checkpoints
    checkpoint_dir: Path = Field(
        default=Path("checkpoints"), validation_alias=_alias("CHECKPOINT_DIR", "checkpoint_dir")
    )  # runs live in <checkpoint_dir>/<experiment_name>
    save_freq: int = Field(default=100, ge=1)  # steps between checkpoints (verl's default -1 never saves)
    test_freq: int = Field(default=50, ge=-1)  # steps between validations; -1 disables
    max_ckpt_to_keep: int = Field(default=2, ge=2)  # >= 2 so a crash while saving leaves a good one
    # seconds merge and resume wait for every rank's shard to reach the bucket (trainer/checkpoint.py); 600 s
    # uploads ~75 GB at 125 MB/s, more than one node's shards of a 3B model with its optimizer: ESTIMATE ~37 GB a
    # node (fp32 weights 12.4 GB + Adam's two moments 24.7 GB for 3.09B parameters), because with HSDP every node
    # saves a whole copy (verl's fsdp_checkpoint_manager.py: every rank saves its shard of its own node's group),
    # so a 2-node checkpoint is ~74 GB
    checkpoint_wait_s: float = Field(default=600.0, ge=0)
    val_before_train: bool = False  # validate the base model before step 1
    # Validation asks the service too: verl's default is every test row (51,713 for full) in ONE batch, i.e.
    # that many concurrent trajectories. Cap the rows and the batch (rows in flight) instead.
    val_max_samples: int = Field(default=1000, ge=-1)  # cap on validation rows; -1 = all of the test split
    val_batch_size: int = Field(default=256, ge=1)  # validation prompts per batch (verl's None = all at once)
    dump_rollouts: bool = False  # write every step's trajectories to <run>/rollouts/<step>.jsonl (SMOKE: on)
    logger: str = "auto"  # auto (console, plus wandb when WANDB_API_KEY is set) | comma list: console,wandb

    # --- retrieval service -----------------------------------------------------------------------------------
    retrieval_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        validation_alias=_alias("RETRIEVAL_SERVICE_URL", "retrieval_urls"),
    )  # comma-separated; later URLs are failovers
    retrieval_api_key_env: str = "RETRIEVAL_API_KEY"  # NAME of the env var holding the bearer token
    # per attempt: reading the answer; TCP connect apart from reading; waiting for a free connection slot; retries
    # after the first try, over all URLs (the client's own defaults, retrieval/client/client.py)
    retrieval_timeout_s: float = Field(default=client.TIMEOUT_S, gt=0)
    retrieval_connect_timeout_s: float = Field(default=client.CONNECT_TIMEOUT_S, gt=0)
    retrieval_pool_timeout_s: float = Field(default=client.POOL_TIMEOUT_S, gt=0)
    retrieval_max_retries: int = Field(default=client.MAX_RETRIES, ge=0)
    health_deadline_s: float = Field(default=120.0, gt=0)  # how long launch waits for /retrieve to answer
    # Abort when more than this share of the last `search_failure_window` searches failed (0 disables): a policy
    # trained against a failing service learns not to search (trainer/plugins/reward.py)
    max_search_failure_rate: float = Field(default=0.05, ge=0, le=1)
    search_failure_window: int = Field(default=200, ge=10)  # searches per rate window, per rollout worker
    allow_small_corpus: bool = Field(
        default=False, validation_alias=_alias("ALLOW_SMALL_CORPUS", "allow_small_corpus")
    )  # 1 = train Search-R1 data against a corpus other than wiki-18 (smoke runs); recorded in the run
    allow_flat_index: bool = Field(
        default=False, validation_alias=_alias("ALLOW_FLAT_INDEX", "allow_flat_index")
    )  # 1 = train against a Flat index over 1M+ passages searched on CPU (too slow for step 1: docs/sizing.md)
    smoke: bool = Field(default=False, validation_alias=_alias("SMOKE", "smoke"))  # apply SMOKE_PRESET
    tool_config_path: Path | None = (
        None  # where the verl tool YAML is written; None = <data_dir>/search_tool.yaml
    )

    @field_validator("experiment_name")
    @classmethod
    def _check_experiment_name(cls, value: str) -> str:
        value = value.strip()
        if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError(f"EXPERIMENT_NAME {value!r} must be one folder name: letters, digits, . _ -")
        return value

    @field_validator("flash_attn", mode="before")
    @classmethod
    def _read_flash_attn(cls, value: Any) -> Any:
        # A string (the environment, .env, a task env) is read by the one parser the YAMLs and the Makefile ask
        # (trainer/node/flash_switch.py), so they cannot install one attention while verl is set up for another.
        return flash_attn_on(value) if isinstance(value, str) else value

    @field_validator("retrieval_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        return split_urls(value) if isinstance(value, str) else value

    @field_validator("retrieval_urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no retrieval URL: set RETRIEVAL_SERVICE_URL, e.g. http://127.0.0.1:8000")
        for url in value:
            if problem := scheme_problem(url):
                raise ValueError(problem)
        return [u.rstrip("/") for u in value]

    @field_validator("retrieval_api_key_env")
    @classmethod
    def _check_env_name(cls, value: str) -> str:
        # Upper-case NAME only: a token pasted here by mistake would otherwise be written into the tool YAML.
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", value):
            raise ValueError(
                f"retrieval_api_key_env must be an environment variable NAME such as RETRIEVAL_API_KEY, "
                f"not a token (got a {len(value)}-character value)"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainSettings:
        if self.smoke:
            for name, value in SMOKE_PRESET.items():
                if name not in self.model_fields_set:
                    setattr(self, name, value)
        self._fold_attn_implementation()
        if not self.experiment_name:
            self.experiment_name = default_experiment_name(
                self.model_name, self.dataset_size, self.total_steps
            )
        if self.logger == "auto":
            self.logger = "console,wandb" if os.environ.get("WANDB_API_KEY") else "console"
        unknown = set(self.loggers) - KNOWN_LOGGERS
        if unknown:
            raise ValueError(
                f"unknown logger(s) {sorted(unknown)}; use auto or some of {sorted(KNOWN_LOGGERS)}"
            )
        if self.ppo_mini_batch_size is not None and self.ppo_mini_batch_size > self.train_batch_size:
            raise ValueError(
                f"ppo_mini_batch_size ({self.ppo_mini_batch_size}) must not exceed train_batch_size "
                f"({self.train_batch_size}); lower SEARCHRL_TRAIN_PPO_MINI_BATCH_SIZE or raise TRAIN_BATCH_SIZE"
            )
        if self.train_batch_size % self.mini_batch_size:
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) must be a multiple of ppo_mini_batch_size "
                f"({self.mini_batch_size})"
            )
        self._check_mode()
        self._check_rehearsal()
        if (self.mini_batch_size * self.rollout_n) % self.n_gpus:
            shape = (
                f"the trainer's GPU count (NUM_NODES - ROLLOUT_NODES) x GPUS_PER_NODE (({self.nnodes} - "
                f"{self.rollout_node_count}) x {self.gpus_per_node})"
                if self.trainer_mode == "separate_async"
                else f"the GPU count NUM_NODES x GPUS_PER_NODE ({self.nnodes} x {self.gpus_per_node})"
            )
            raise ValueError(
                f"ppo_mini_batch_size x rollout_n ({self.mini_batch_size} x {self.rollout_n}) must be divisible "
                f"by {shape}; change TRAIN_BATCH_SIZE or the GPU count"
            )
        per_gpu = self.mini_batch_size * self.rollout_n // self.n_gpus
        if not self.removes_padding and per_gpu % self.micro_batch_rows:
            # verl's fixed micro batches split each GPU's share evenly (workers/engine/utils.py
            # prepare_micro_batches asserts it)
            raise ValueError(
                f"each GPU's share of a PPO mini batch ({per_gpu} samples) must be a multiple of the micro batch "
                f"({self.micro_batch_rows} rows = token budget {self.token_budget_per_gpu} // {self.max_seq_len} "
                "tokens, capped by micro_batch_size_per_gpu); change TRAIN_BATCH_SIZE, ROLLOUT_N or "
                "SEARCHRL_TRAIN_MICRO_BATCH_SIZE_PER_GPU"
            )
        if self.gpus_per_node % self.rollout_tp:
            raise ValueError(
                f"rollout_tp ({self.rollout_tp}) must divide GPUS_PER_NODE ({self.gpus_per_node})"
            )
        if self.rollout_name == "sglang":
            from searchrl.trainer.weight_sync.sglang_readback import readback_refusal  # standard library only

            refusal = readback_refusal(self.model_name)
            if refusal:
                raise ValueError(refusal)
        if self.top_p < 1 and self.temperature != 1:
            # neither of vLLM's log-prob modes then has the actor's semantics (rollout_logprobs_mode)
            raise ValueError(
                f"top_p {self.top_p} with temperature {self.temperature}: vLLM's processed log-probs are renormalised "
                "over the nucleus and its raw ones ignore the temperature, so the rollout/actor check would compare "
                "different distributions; set SEARCHRL_TRAIN_TOP_P=1 or SEARCHRL_TRAIN_TEMPERATURE=1"
            )
        if self.max_tool_response_chars < self.passage_max_chars:
            raise ValueError("passage_max_chars exceeds the observation budget")  # pragma: no cover
        return self

    def _check_mode(self) -> None:
        """The node split and the weight transfer of separate_async; ROLLOUT_NODES and a checkpoint engine are
        refused in the other modes, where they would be silently ignored."""
        if self.trainer_mode != "separate_async":
            if self.rollout_nodes:
                raise ValueError(
                    f"ROLLOUT_NODES={self.rollout_nodes} applies to TRAINER_MODE=separate_async only "
                    f"(TRAINER_MODE={self.trainer_mode} trains and generates on every node): unset it"
                )
            if self.checkpoint_engine_module is not None:
                raise ValueError(
                    "checkpoint_engine_module applies to TRAINER_MODE=separate_async only "
                    f"(TRAINER_MODE={self.trainer_mode} syncs weights in process)"
                )
            return
        if self.checkpoint_engine == "naive":
            raise ValueError(
                "TRAINER_MODE=separate_async needs a checkpoint engine that crosses processes (nccl on GPUs): "
                "verl refuses the in-process 'naive' one"
            )
        if self.rollout_node_count >= self.nnodes:
            raise ValueError(
                f"TRAINER_MODE=separate_async needs a trainer node beside the rollout nodes: ROLLOUT_NODES="
                f"{self.rollout_node_count} leaves none of NUM_NODES={self.nnodes}; use 2 or more nodes"
            )

    def _check_rehearsal(self) -> None:
        """REHEARSE_MULTI_NODE only where it means something: one node, split into 2 HSDP groups that shard."""
        if not self.rehearse_multi_node:
            return
        if self.nnodes > 1:
            raise ValueError(
                f"REHEARSE_MULTI_NODE=1 rehearses the multi-node trainer on one node, but NUM_NODES={self.nnodes} "
                "already renders FSDP2, no-sync and HSDP across the nodes: unset REHEARSE_MULTI_NODE or use NUM_NODES=1"
            )
        if self.gpus_per_node < 4 or self.gpus_per_node % 2:
            # verl's mesh is (replicas, fsdp_size) = (2, GPUS_PER_NODE / 2): it must divide, and a group of one GPU
            # shards nothing (verl's eval context skips the reshard for fsdp_size 1, engine/fsdp/transformer_impl.py)
            smoke = self.smoke and self.gpus_per_node == 1
            preset = " (SMOKE=1's one GPU unless GPUS_PER_NODE is set)" if smoke else ""
            raise ValueError(
                f"REHEARSE_MULTI_NODE=1 splits the node into 2 HSDP groups of GPUS_PER_NODE / 2 GPUs that shard, "
                f"but GPUS_PER_NODE={self.gpus_per_node}{preset}: use an even count of 4 or more (8 on an H100 node)"
            )

    def _fold_attn_implementation(self) -> None:
        """attn_implementation, when given, decides flash_attn (unless an explicit FLASH_ATTN says otherwise)."""
        if self.attn_implementation is None:
            return
        wanted = self.attn_implementation == "flash_attention_2"
        if "flash_attn" in self.model_fields_set and self.flash_attn != wanted:
            raise ValueError(
                f"FLASH_ATTN={int(self.flash_attn)} contradicts attn_implementation={self.attn_implementation}: "
                "set only FLASH_ATTN (1 = flash_attention_2, 0 = sdpa)"
            )
        self.flash_attn = wanted
        self.attn_implementation = None

    # --- derived values ---------------------------------------------------------------------------------------
    @property
    def attention(self) -> str:
        """verl's `attn_implementation` for the FSDP actor and reference (model.override_config)."""
        return "flash_attention_2" if self.flash_attn else "sdpa"

    @property
    def loggers(self) -> list[str]:
        return [name.strip() for name in self.logger.split(",") if name.strip()]

    @property
    def mini_batch_size(self) -> int:
        """PPO mini batch in prompts: Search-R1 updates twice per step (512 -> 256)."""
        return self.ppo_mini_batch_size or max(1, self.train_batch_size // 2)

    @property
    def rollout_node_count(self) -> int:
        """Nodes that only generate: ROLLOUT_NODES (0 = one) in separate_async, none in the other modes."""
        if self.trainer_mode != "separate_async":
            return 0
        return self.rollout_nodes or 1

    @property
    def trainer_nodes(self) -> int:
        """Nodes whose GPUs hold the FSDP actor (and reference): every node but the rollout pool."""
        return self.nnodes - self.rollout_node_count

    @property
    def n_gpus(self) -> int:
        """The trainer's GPUs: what a PPO mini batch is split over (verl's trainer.nnodes x n_gpus_per_node)."""
        return self.trainer_nodes * self.gpus_per_node

    @property
    def parameter_sync_step(self) -> int:
        """Local updates per weight push in separate_async (verl asserts batch == this x mini batch,
        trainer_separate_async.py): Search-R1's 512 / 256 = 2, the same two updates per step as sync. verl's
        other modes push after every update (1)."""
        if self.trainer_mode != "separate_async":
            return 1
        return self.train_batch_size // self.mini_batch_size

    @property
    def max_seq_len(self) -> int:
        """The longest sample verl can hold: prompt plus the whole trajectory."""
        return self.max_prompt_length + self.max_response_length

    @property
    def token_budget_per_gpu(self) -> int:
        """Per-GPU tokens in one forward/backward pass: room for two full sequences (docs/training.md)."""
        return self.max_token_len_per_gpu or 2 * self.max_seq_len

    @property
    def removes_padding(self) -> bool:
        """verl packs each micro batch into one row (use_remove_padding) with dynamic batching by tokens: always with
        flash-attn's varlen kernels; under sdpa as remove_padding says, auto being the cheaper estimated step
        (trainer/step_cost.py). Packed sdpa is correct (tests/trainer/test_packed_sdpa.py: verl's own FSDP engine,
        packed vs padded log-probs, entropy and gradients) but computes a dense mask over the packed row."""
        from searchrl.trainer.step_cost import choose_packing  # the one rule, and the reason the plan prints

        return choose_packing(self).packed

    @property
    def rollout_logprobs_mode(self) -> str:
        """vLLM's `logprobs_mode` for the rollout's log-probs, chosen so they mean what the actor's do.

        verl's actor computes old log-probs over the full vocabulary at the sampling temperature; verl 0.9.1 asks
        vLLM for `processed_logprobs` (trainer/config/rollout/rollout.yaml:93), which vLLM 0.24.0 takes after the
        top-p mask, renormalised over the nucleus (v1/sample/ops/topk_topp_sampler.py:123-141). With top_p < 1 verl's
        `training/rollout_probs_diff_mean` then measures the nucleus, not the sync: a perfectly synced run at
        Search-R1's top_p 0.95 crosses the 0.01 stop (docs/training.md "Rollout log-probs"). `raw_logprobs` is the
        model's own log-softmax, before temperature and mask: the actor's semantics at temperature 1. With
        top_p 1, `processed_logprobs` (after temperature, no mask) is the actor's at any temperature. top_p < 1
        at another temperature has no matching mode and is refused by validation. Every trainer mode recomputes
        the old policy with the actor (verl's rollout_correction.bypass_mode stays false), so these log-probs feed
        the check and verl's rollout_corr/* metrics only, which need the same semantics.
        """
        return "raw_logprobs" if self.top_p < 1 else "processed_logprobs"

    @property
    def fsdp_size(self) -> int:
        """verl's fsdp_config.fsdp_size: one node's GPUs when the trainer spans nodes (parameters are gathered over
        NVLink and only gradient shards cross the node link, once per replica sync), verl's -1 (every GPU) when it
        has one node (one node, or separate_async with one trainer node). REHEARSE_MULTI_NODE=1 on one node: half
        its GPUs, so verl's (ddp, fsdp) mesh is the same HSDP, 2 replicas inside the node instead of across nodes.

        Not with one GPU per node: torch's FSDP1 turns a hybrid shard group of one GPU into NO_SHARD and then
        all-reduces gradients over that group of one, so the replicas never average (seen on gloo in
        tests/trainer/test_fsdp_sync.py's setup); there the whole cluster stays one group.
        """
        if self.rehearse_multi_node:
            return self.gpus_per_node // 2
        return self.gpus_per_node if self.trainer_nodes > 1 and self.gpus_per_node > 1 else -1

    @property
    def fsdp_replicas(self) -> int:
        """HSDP replicas of the model (verl's `ddp` mesh dimension): 1 when one FSDP group spans every GPU."""
        return self.n_gpus // self.fsdp_size if 0 < self.fsdp_size < self.n_gpus else 1

    @property
    def sync_grads_per_mini_batch(self) -> bool:
        """verl's use_no_sync_for_gradient_accumulation on multi-node runs (and their one-node rehearsal,
        REHEARSE_MULTI_NODE): one gradient reduction per mini batch instead of one per micro batch, paid for with
        unsharded gradients between them (docs/training.md)."""
        return self.trainer_nodes > 1 or self.rehearse_multi_node

    @property
    def fsdp_strategy(self) -> str:
        """verl's actor.strategy (the reference model follows it): "fsdp2" when gradients sync once per mini batch,
        verl's default "fsdp" (FSDP1) otherwise.

        Under no-sync torch's FSDP1 keeps the unsharded gradient in the parameter dtype, bf16 with verl's
        MixedPrecision: its post-backward hook returns before the cast to the fp32 reduce dtype
        (torch/distributed/fsdp/_runtime_utils.py:743-746 vs 757-764), so a mini batch's micro batches are summed
        in bf16. FSDP2 upcasts the first unsynced gradient to the reduce dtype and adds the later ones into it
        (_fully_shard/_fsdp_param.py:670-688, called from _fsdp_param_group.py:496-511; line numbers of the GPU
        lock's torch 2.11.0), at 4 bytes a parameter per GPU instead of 2 (docs/training.md
        "Multi-node notes", measured in tests/trainer/test_grad_accumulation.py). verl 0.9.1's
        engine maps no-sync to FSDP2's set_requires_gradient_sync(False) and builds HSDP from the same 2-D mesh
        (workers/engine/fsdp/transformer_impl.py:692-722, 450-473).
        """
        return "fsdp2" if self.sync_grads_per_mini_batch else "fsdp"

    @property
    def micro_batch_rows(self) -> int:
        """Samples per micro batch (actor update, reference and rollout log-probs) when verl pads.

        Without padding removal verl's FSDP engine pads each micro batch to its longest sample
        (verl/workers/engine/fsdp/transformer_impl.py, the NO_PADDING branch), while its dynamic batching counts
        unpadded tokens against the budget: one 5,120-token trajectory among short ones then pads to many times
        the budget. Fixed micro batches of budget // max_seq_len rows bound the padded micro batch by the budget
        itself (arithmetic in docs/training.md). `micro_batch_size_per_gpu` caps it further.
        """
        return max(1, min(self.micro_batch_size_per_gpu, self.token_budget_per_gpu // self.max_seq_len))

    @property
    def rollout(self) -> RolloutSpec:
        """The episode rules eval must share (searchrl/rollout.py); `searchrl eval` records the same object."""
        return RolloutSpec.from_settings(
            self, max_prompt_tokens="max_prompt_length", max_response_tokens="max_response_length"
        )

    @property
    def max_tool_response_chars(self) -> int:
        """Observation cap in characters: top-k passages of `passage_max_chars` plus their framing."""
        return self.rollout.observation_chars

    @property
    def max_assistant_turns(self) -> int:
        """Search-R1 counts searches: up to `max_turns` generations that search, then one that answers."""
        return self.rollout.max_assistant_turns

    @property
    def split_dir(self) -> Path:
        return self.data_dir / self.dataset_size

    @property
    def train_file(self) -> Path:
        return self.split_dir / "train.parquet"

    @property
    def test_file(self) -> Path:
        return self.split_dir / "test.parquet"

    @property
    def run_dir(self) -> Path:
        """verl's trainer.default_local_dir: one folder per experiment, so resume finds its own checkpoints."""
        return self.checkpoint_dir / self.experiment_name

    @property
    def rollout_data_dir(self) -> Path | None:
        return self.run_dir / "rollouts" if self.dump_rollouts else None

    def expected_train_rows(self) -> int:
        """Train rows before data prep: meta.json of an earlier prep, else the size's row count."""
        import json

        meta = self.split_dir / "meta.json"
        if meta.is_file():
            stored = json.loads(meta.read_text()).get("train_rows")
            if isinstance(stored, int):
                return stored
        rows = DATASET_SIZES[self.dataset_size][0]
        if rows is None and self.qa_source == SEARCH_R1_DATASET:
            rows = FULL_TRAIN_ROWS
        if rows is None:
            raise ConfigError(
                f"the train row count of {self.qa_source} is unknown until `searchrl train data` has run"
            )
        return rows

    def epochs_for(self, train_rows: int) -> int:
        """verl's trainer.total_epochs so that training really reaches total_steps.

        verl (trainer/ppo/ray_trainer.py) batches with drop_last=True, so an epoch is train_rows // batch steps,
        and it stops at total_epochs x steps_per_epoch even when total_training_steps (which sizes the LR
        schedule) is larger. One spare epoch covers prompts dropped by filter_overlong_prompts; verl still stops
        at total_training_steps.
        """
        steps_per_epoch = train_rows // self.train_batch_size
        if steps_per_epoch < 1:
            raise ConfigError(
                f"{train_rows} train rows (DATASET_SIZE={self.dataset_size}) make no full batch of "
                f"TRAIN_BATCH_SIZE={self.train_batch_size} (verl drops the partial one): lower TRAIN_BATCH_SIZE "
                "or use a larger DATASET_SIZE"
            )
        if self.total_epochs is not None:
            reach = self.total_epochs * steps_per_epoch
            if reach < self.total_steps:
                raise ConfigError(
                    f"verl would stop at step {reach} ({self.total_epochs} epochs x {steps_per_epoch} steps of "
                    f"{train_rows} rows // batch {self.train_batch_size}) while TOTAL_STEPS={self.total_steps} "
                    f"sizes the LR schedule: unset SEARCHRL_TRAIN_TOTAL_EPOCHS or set TOTAL_STEPS={reach}"
                )
            return self.total_epochs
        return -(-self.total_steps // steps_per_epoch) + 1

    @property
    def resolved_tool_config_path(self) -> Path:
        return self.tool_config_path or self.data_dir / "search_tool.yaml"

    def redacted_dump(self) -> dict[str, Any]:
        """Settings as JSON-ready data with credentials removed (URLs may carry user:password@)."""
        data = self.model_dump(mode="json")
        data["retrieval_urls"] = [redact_url(u) for u in self.retrieval_urls]
        return data


# SMOKE=1 (`make train-smoke`): Qwen2.5-0.5B-Instruct, 4 steps of 16 prompts x 2 samples on one GPU, a checkpoint
# at steps 2 and 4, rollouts dumped so the post-run check can count searches, the bundled corpus allowed.
SMOKE_PRESET: dict[str, Any] = {
    "model_name": "Qwen/Qwen2.5-0.5B-Instruct",
    "dataset_size": "small",
    "train_batch_size": 16,
    "rollout_n": 2,
    "total_steps": 4,
    "save_freq": 2,
    "test_freq": -1,
    "val_max_samples": 16,
    "val_batch_size": 16,
    "micro_batch_size_per_gpu": 4,
    # the full run's lengths (max_prompt_length 1024, max_response_length 4096): the first GPU run sees the real
    # micro batch (packed to the 10,240-token budget with flash-attn; 2 padded rows of 5,120 with FLASH_ATTN=0)
    "gpu_memory_utilization": 0.4,
    "nnodes": 1,
    "gpus_per_node": 1,
    "dump_rollouts": True,
    "allow_small_corpus": True,
}


def default_experiment_name(model_name: str, dataset_size: str, total_steps: int) -> str:
    """search-r1-<model>-<size>-<steps>steps: runs that differ in size or length never share a folder."""
    model = re.sub(r"[^a-z0-9.]+", "-", model_name.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-.")
    return f"search-r1-{model or 'model'}-{dataset_size}-{total_steps}steps"


__all__ = [
    "DATASET_SIZES",
    "FULL_TRAIN_ROWS",
    "SEARCH_R1_DATASET",
    "SMOKE_PRESET",
    "DatasetSize",
    "TrainSettings",
    "TrainerMode",
    "default_experiment_name",
]
