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
from typing import Any

import yaml

from searchrl.prompt import SEARCH_TOOL_SCHEMA
from searchrl.trainer.plugins.tool_config import TOOL_CLASS, SearchToolConfig
from searchrl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)


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
