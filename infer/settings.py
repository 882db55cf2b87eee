"""InferSettings: every knob of `searchrl eval` and the agent loop, from flags > env > .env > defaults.

Env names are SEARCHRL_INFER_<FIELD>, except the ones users know from the SkyPilot recipes
(`RETRIEVAL_SERVICE_URL`, `RETRIEVAL_API_KEY`, `MODEL_NAME`), which are declared as aliases.
Defaults follow the Search-R1 evaluation protocol (../shared/DESIGN.md section 6): top-3 passages, greedy
decoding, 500 new tokens per turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from searchrl.prompt import observation_budget

Engine = Literal["server", "local"]
Api = Literal["completions", "chat"]


class InferSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SEARCHRL_INFER_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
    )

    # --- the model ------------------------------------------------------------------------------------------
    model: str = Field(  # served model name (server) or HF id / local folder (local)
        default="Qwen/Qwen2.5-3B-Instruct",
        validation_alias=AliasChoices("SEARCHRL_INFER_MODEL", "MODEL_NAME"),
    )
    tokenizer: str | None = None  # HF id or folder whose chat template renders prompts; default: `model`
    engine: Engine = "server"  # server: an OpenAI-compatible sglang/vLLM endpoint | local: HF transformers
    api: Api = "completions"  # completions: we render the training template (exact) | chat: server does
    llm_url: str = "http://127.0.0.1:30000/v1"  # OpenAI-compatible base URL (sglang :30000, vLLM :8000)
    llm_api_key: SecretStr | None = None  # bearer token for the LLM server, if it wants one
    llm_timeout_s: float = Field(default=300.0, gt=0)  # per generation request
    llm_max_retries: int = Field(default=3, ge=0)  # retries on connection errors, 429 and 5xx
    device: str = "auto"  # local engine only: auto | cpu | cuda
    label: str | None = None  # run name in reports; default "<model>, <backend>, search|no-search"

    # --- decoding -------------------------------------------------------------------------------------------
    temperature: float = Field(default=0.0, ge=0)  # 0 = greedy (Search-R1 eval)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = 0  # sampling seed sent with every request (and QA subsampling seed)
    max_tokens_per_turn: int = Field(default=500, ge=1)  # new tokens per assistant turn
    stop_after_tool_call: bool = False  # also stop on </tool_call> (helps base models that ramble on)

    # --- the agent loop ------------------------------------------------------------------------------------
    search: bool = True  # False = the no-search baseline (no tool in the prompt, one turn)
    max_turns: int = Field(  # search turns, as the trainer's MAX_TURNS: at most max_turns + 1 assistant turns
        default=4, ge=1, validation_alias=AliasChoices("SEARCHRL_INFER_MAX_TURNS", "MAX_TURNS")
    )
    topk: int = Field(default=3, ge=1)  # passages per query
    passage_max_chars: int = Field(default=800, ge=50)  # cap per passage text, as the trainer's tool
    max_observation_chars: int | None = Field(
        default=None, ge=100
    )  # whole observation; None = trainer's budget
    malformed_feedback: bool = (
        False  # tell the model why a tool call failed to parse (training: episode ends)
    )
    concurrency: int = Field(default=16, ge=1)  # questions in flight

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
    limit: int | None = Field(default=None, ge=1)  # questions per dataset, sampled with `seed`
    output_dir: Path = Path("results")  # result files land here as <label-slug>.json

    @field_validator("llm_url", "retrieval_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        return v.strip().rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> InferSettings:
        for url in [self.llm_url, *self.retrieval_urls]:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"URL {url!r} must start with http:// or https://")
        if self.api == "chat" and self.engine == "local":
            raise ValueError(
                "api=chat needs engine=server; the local engine renders the chat template itself"
            )
        return self

    @property
    def observation_budget(self) -> int:
        """The observation cap the trainer's tool uses (trainer/settings.py `max_tool_response_chars`)."""
        if self.max_observation_chars is not None:
            return self.max_observation_chars
        return observation_budget(self.topk, self.passage_max_chars)

    @property
    def retrieval_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.retrieval_url.split(",") if u.strip()]

    @property
    def dataset_filter(self) -> list[str] | None:
        if not self.datasets:
            return None
        return [d.strip() for d in self.datasets.split(",") if d.strip()]

    def llm_api_key_value(self) -> str | None:
        return self.llm_api_key.get_secret_value() if self.llm_api_key else None

    def retrieval_api_key_value(self) -> str | None:
        return self.retrieval_api_key.get_secret_value() if self.retrieval_api_key else None


__all__ = ["Api", "Engine", "InferSettings"]
