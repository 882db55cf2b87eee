"""Write the verl tool YAML (`multi_turn.tool_config_path`) from TrainSettings, at launch time.

Run: `searchrl train tool-config` (launch does it too). It is written when a run starts, never at install time,
because the retrieval URL is only known then (a SkyPilot endpoint, RETRIEVAL_SERVICE_URL). The token is not in
the file: the config names the environment variable that holds it (`api_key_env: RETRIEVAL_API_KEY`), which
each rollout worker reads. verl's workers on other nodes read this path too, so on a multi-node cluster run the
command on every node (or put the file on shared storage).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from searchrl.prompt import SEARCH_TOOL_SCHEMA
from searchrl.retrieval import client
from searchrl.rollout import MAX_TOPK, ROLLOUT_DEFAULTS
from searchrl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)

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


def render_tool_config(settings: TrainSettings) -> dict[str, Any]:
    """The YAML document as data; the tool's own config model validates it, so a typo fails here."""
    config = SearchToolConfig(
        retrieval_urls=list(settings.retrieval_urls),
        api_key_env=settings.retrieval_api_key_env,
        topk=settings.topk,
        timeout_s=settings.retrieval_timeout_s,
        connect_timeout_s=settings.retrieval_connect_timeout_s,
        pool_timeout_s=settings.retrieval_pool_timeout_s,
        max_retries=settings.retrieval_max_retries,
        passage_max_chars=settings.passage_max_chars,
        max_chars=settings.max_tool_response_chars,
    )
    return {
        "tools": [
            {
                "class_name": TOOL_CLASS,
                "config": config.model_dump(mode="json"),
                "tool_schema": SEARCH_TOOL_SCHEMA,
            }
        ]
    }


def write_tool_config(settings: TrainSettings, path: Path | None = None) -> Path:
    """Write the tool YAML (atomically) and return its absolute path."""
    target = (path or settings.resolved_tool_config_path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(
        "# Written by `searchrl train tool-config` at launch; do not edit (re-run the command instead).\n"
        + yaml.safe_dump(render_tool_config(settings), sort_keys=False)
    )
    tmp.replace(target)
    log.info("wrote verl tool config %s (%d retrieval URL(s))", target, len(settings.retrieval_urls))
    return target


__all__ = ["TOOL_CLASS", "SearchToolConfig", "render_tool_config", "write_tool_config"]
