"""The `config:` block of the verl tool YAML, beside the tool that reads it (trainer/plugins/tool.py).

Here, not in trainer/toolconfig.py (the CLI's writer of the YAML), so that every Ray worker that loads the tool
imports only this model and the client's defaults, not TrainSettings and the CLI room behind it (issue 54 item 3;
tests/trainer/test_rooms.py holds plugins/ to it). The writer validates with this same model, so a typo fails at
launch, not when verl loads the tool.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from searchrl.retrieval import client
from searchrl.rollout import MAX_TOPK, ROLLOUT_DEFAULTS

TOOL_CLASS = "searchrl.trainer.plugins.tool.SearchTool"


class SearchToolConfig(BaseModel):
    """The `config:` block of the tool YAML; unknown keys are errors so a typo fails when verl loads the tool."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["native"] = "native"  # verl's tool type for BaseTool subclasses
    retrieval_urls: list[str] = Field(min_length=1)  # tried in order: later URLs are failovers
    api_key_env: str | None = "RETRIEVAL_API_KEY"  # NAME of the env var holding the bearer token
    topk: int = Field(default=ROLLOUT_DEFAULTS.topk, ge=1, le=MAX_TOPK)
    timeout_s: float = Field(default=client.TIMEOUT_S, gt=0)  # one attempt, reading the answer
    connect_timeout_s: float = Field(
        default=client.CONNECT_TIMEOUT_S, gt=0
    )  # TCP connect: a dead replica fails fast
    pool_timeout_s: float = Field(
        default=client.POOL_TIMEOUT_S, gt=0
    )  # waiting for a connection slot: load, not a fault
    stats_log_interval_s: float = Field(default=60.0, ge=0)  # per-URL client counters in the worker log
    max_retries: int = Field(default=client.MAX_RETRIES, ge=0)
    backoff_base_s: float = Field(default=client.BACKOFF_BASE_S, ge=0)
    backoff_max_s: float = Field(default=client.BACKOFF_MAX_S, ge=0)
    passage_max_chars: int | None = Field(default=800, ge=1)  # cap per passage text
    max_chars: int | None = Field(default=None, ge=1)  # cap on the whole observation

    @field_validator("retrieval_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError("retrieval URLs must start with http:// or https://")
        return value


__all__ = ["TOOL_CLASS", "SearchToolConfig"]
