"""InferSettings: every knob of `searchrl eval` and the agent loop, from flags > env > .env > defaults.

Env names are SEARCHRL_INFER_<FIELD>, except the ones users know from the SkyPilot recipes
(`RETRIEVAL_SERVICE_URL`, `RETRIEVAL_API_KEY`, `MODEL_NAME`), which are declared as aliases.
Defaults follow the Search-R1 evaluation protocol (../shared/DESIGN.md section 6): top-3 passages, greedy
decoding. The episode rules (turns, token budgets, parallel calls, prompt format) default to the ones training
uses, from the one shared `searchrl.rollout.RolloutSpec`; `rollout` builds it from these settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator

from searchrl.chat_template import ChatTemplateChoice
from searchrl.config import StrictSettings, area_config
from searchrl.prompt import observation_budget
from searchrl.rollout import MAX_TOPK, ROLLOUT_DEFAULTS, PromptFormat, RolloutSpec
from searchrl.urls import scheme_problem, split_urls

Engine = Literal["server", "local", "sglang"]
# What prompt_format=search-r1 sets unless given: Search-R1's eval (max_response_length and max_obs_length of
# PeterGriffinJin/Search-R1 `train_ppo.sh` / `infer.py`: 500 tokens each).
SEARCH_R1_PRESET = {"max_tokens_per_turn": 500, "max_observation_tokens": 500}
Api = Literal["completions", "chat"]


class InferSettings(StrictSettings):
    model_config = area_config("SEARCHRL_INFER_")

    # --- the model ------------------------------------------------------------------------------------------
    model: str = Field(  # served model name (server) or HF id / local folder (local)
        default="Qwen/Qwen2.5-3B-Instruct",
        validation_alias=AliasChoices("SEARCHRL_INFER_MODEL", "MODEL_NAME"),
    )
    tokenizer: str | None = None  # HF id or folder whose chat template renders prompts; default: `model`
    engine: Engine = "server"  # server: a running OpenAI-compatible endpoint | sglang: start one | local: HF
    api: Api = "completions"  # completions: we render the training template (exact) | chat: server does
    llm_url: str = "http://127.0.0.1:30000/v1"  # OpenAI-compatible base URL (sglang :30000, vLLM :8000)
    llm_api_key: SecretStr | None = None  # bearer token for the LLM server, if it wants one
    llm_timeout_s: float = Field(default=300.0, gt=0)  # per generation request
    llm_max_retries: int = Field(default=8, ge=0)  # retries on connection errors, 429 and 5xx
    llm_retry_max_wait_s: float = Field(
        default=120.0, gt=0
    )  # back-off cap: 8 retries span minutes, not seconds
    # seconds to wait at start for the LLM server to answer /v1/models (one still loading weights);
    # 0 = a refused connection fails at once
    wait_for_llm_s: float = Field(default=0.0, ge=0)
    device: str = "auto"  # local engine only: auto | cpu | cuda
    # local engine: torch threads for generation; 0 = torch's default (all cores). On a machine shared with other
    # jobs 1 can be several times faster: OpenMP threads that do not get a core wait on each other.
    local_threads: int = Field(default=0, ge=0)
    sglang_command: str | None = None  # engine=sglang: what starts the server; None = this Python's sglang
    # engine=sglang: pass --enable-deterministic-inference (greedy and seeded runs give the same tokens whatever
    # the batch; slower). Off: batch composition changes results, so no two runs are token-identical.
    deterministic: bool = True
    sglang_args: str = ""  # engine=sglang: extra launch_server flags, e.g. "--mem-fraction-static 0.6 --tp 2"
    sglang_startup_timeout_s: float = Field(default=1800.0, gt=0)  # model download + load + CUDA graphs
    label: str | None = None  # run name in reports; default "<model>, <backend>, search|no-search"

    # --- decoding -------------------------------------------------------------------------------------------
    temperature: float = Field(default=0.0, ge=0)  # 0 = greedy (Search-R1 eval)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = 0  # decoding seed sent with every request
    sample_seed: int = 0  # which questions --limit samples (separate, so a decoding change keeps the set)
    max_tokens_per_turn: int | None = Field(
        default=ROLLOUT_DEFAULTS.max_tokens_per_turn, ge=1
    )  # per-turn cap; None = training's rule (what is left of the budget)
    max_prompt_tokens: int = Field(default=ROLLOUT_DEFAULTS.max_prompt_tokens, ge=64)  # as training
    max_response_tokens: int = Field(
        default=ROLLOUT_DEFAULTS.max_response_tokens, ge=64
    )  # whole trajectory after the prompt, observations included, as training's max_response_length
    stop_after_tool_call: bool = False  # also stop on </tool_call> (helps base models that ramble on)
    # search-r1 format: observation cut to this many tokens (Search-R1's max_obs_length); preset 500
    max_observation_tokens: int | None = Field(default=None, ge=1)

    # --- the agent loop ------------------------------------------------------------------------------------
    search: bool = True  # False = the no-search baseline (no tool in the prompt, one turn)
    max_turns: int = Field(  # search turns, as the trainer's MAX_TURNS: at most max_turns + 1 assistant turns
        default=ROLLOUT_DEFAULTS.max_turns,
        ge=1,
        validation_alias=AliasChoices("SEARCHRL_INFER_MAX_TURNS", "MAX_TURNS"),
    )
    max_parallel_calls: int = Field(default=ROLLOUT_DEFAULTS.max_parallel_calls, ge=1)  # calls run per turn
    prompt_format: PromptFormat = ROLLOUT_DEFAULTS.prompt_format  # searchrl | search-r1 (released ckpts)
    # model: the tokenizer's own chat template (refused when it drops tools=) | searchrl: the repo's ChatML/hermes
    # tool template (searchrl/chat_template.py), for ChatML models whose own template has no tool support
    chat_template: ChatTemplateChoice = "model"
    topk: int = Field(default=ROLLOUT_DEFAULTS.topk, ge=1, le=MAX_TOPK)  # passages per query
    passage_max_chars: int = Field(default=ROLLOUT_DEFAULTS.passage_max_chars, ge=50)  # as the trainer's tool
    max_observation_chars: int | None = Field(
        default=None, ge=100
    )  # whole observation; None = trainer's budget
    malformed_feedback: bool = (
        False  # tell the model why a tool call failed to parse (training: episode ends)
    )
    concurrency: int = Field(default=16, ge=1)  # questions in flight
    max_failure_rate: float = Field(
        default=0.02, ge=0, le=1
    )  # share of questions with a search failure or LLM error above which the run is invalid (per dataset too)
    retry_failed: bool = (
        False  # re-run the questions whose record failed (outage over), replacing their lines
    )
    stop_when_invalid: bool = True  # stop once failures make the run invalid whatever the rest gives
    # stop after this many service-side search failures in a row (a dead backend); 0 = never
    max_consecutive_failures: int = Field(default=20, ge=0)

    # --- retrieval --------------------------------------------------------------------------------------------
    retrieval_url: str = Field(  # one URL, or several separated by commas (failover in order)
        default="http://127.0.0.1:8000",
        validation_alias=AliasChoices("RETRIEVAL_SERVICE_URL", "SEARCHRL_INFER_RETRIEVAL_URL"),
    )
    retrieval_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("RETRIEVAL_API_KEY", "SEARCHRL_INFER_RETRIEVAL_API_KEY")
    )
    retrieval_timeout_s: float = Field(default=30.0, gt=0)

    # --- data and output -----------------------------------------------------------------------------------
    qa: str = "dev"  # dev (bundled dev set) | searchr1-test (HF parquet) | path to .jsonl / .parquet
    datasets: str | None = None  # comma-separated data_source filter, e.g. "nq,hotpotqa"
    limit: int | None = Field(default=None, ge=1)  # questions per dataset, sampled with `sample_seed`
    output_dir: Path = Path("results")  # <label-slug>-<protocol hash>.json (+ .jsonl appended per question)

    @field_validator("llm_url", "retrieval_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        return v.strip().rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> InferSettings:
        for url, what in [(self.llm_url, "LLM URL"), *((u, "retrieval URL") for u in self.retrieval_urls)]:
            if problem := scheme_problem(url, what):
                raise ValueError(problem)
        if self.api == "chat" and self.prompt_format == "search-r1":
            raise ValueError(
                "prompt_format=search-r1 needs api=completions (results are spliced into the assistant turn)"
            )
        if self.api == "chat" and self.engine == "local":
            raise ValueError(
                "api=chat needs engine=server; the local engine renders the chat template itself"
            )
        if self.prompt_format == "search-r1":
            # Search-R1's evaluation: 500 new tokens per turn, observations cut at 500 tokens. A preset of the
            # format, so a released checkpoint is measured as it was trained without flags to remember.
            for name, value in SEARCH_R1_PRESET.items():
                if name not in self.model_fields_set:
                    setattr(self, name, value)
        elif self.max_observation_tokens is not None:
            raise ValueError(
                "max_observation_tokens applies to prompt_format=search-r1; searchrl caps observations in "
                "characters (max_observation_chars), as the trainer's tool does"
            )
        return self

    @property
    def rollout(self) -> RolloutSpec:
        """The episode rules, the same object training builds (searchrl/rollout.py)."""
        return RolloutSpec.from_settings(self)

    @property
    def observation_budget(self) -> int:
        """The observation cap the trainer's tool uses (trainer/settings.py `max_tool_response_chars`)."""
        if self.max_observation_chars is not None:
            return self.max_observation_chars
        return observation_budget(self.topk, self.passage_max_chars)

    @property
    def retrieval_urls(self) -> list[str]:
        return split_urls(self.retrieval_url)

    @property
    def dataset_filter(self) -> list[str] | None:
        if not self.datasets:
            return None
        return [d.strip() for d in self.datasets.split(",") if d.strip()]

    def llm_api_key_value(self) -> str | None:
        return self.llm_api_key.get_secret_value() if self.llm_api_key else None

    def retrieval_api_key_value(self) -> str | None:
        return self.retrieval_api_key.get_secret_value() if self.retrieval_api_key else None


__all__ = ["SEARCH_R1_PRESET", "Api", "Engine", "InferSettings"]
