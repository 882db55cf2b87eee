"""SearchTool: verl's BaseTool for our /retrieve service, a thin adapter over RetrievalClient and prompt.py.

verl 0.9 removed its search tool (../shared/DESIGN.md section 3); this is the documented extension point, named
in the tool YAML that trainer/toolconfig.py writes:

    tools:
      - class_name: searchrl.trainer.plugins.tool.SearchTool
        config: {type: native, retrieval_urls: [...], api_key_env: RETRIEVAL_API_KEY, topk: 3, ...}
        tool_schema: <searchrl.prompt.SEARCH_TOOL_SCHEMA>

verl constructs tools in the dataset process (to count prompt tokens) as well as in every rollout worker, so
`__init__` only validates the config: no network, no Ray actors, no event loop. The HTTP session is created on
the first search, in the worker's running loop (RetrievalClient does that), and the bearer token is read from
the environment variable the config *names*, so the token never appears in the YAML.

Every failure becomes an observation the model sees ("search failed: timeout"), never a silent empty result.
verl's ToolAgentLoop drops the metrics dict that execute() returns, so the tool also adds per-trajectory counters
to the loop's `extra_fields`: verl passes them to the reward function (which stops a run whose searches keep
failing, trainer/plugins/reward.py) and stores them with the sample, where the trainer turns each step's worth into
`search/*` metrics for the console and W&B (trainer/plugins/metrics.py, trainer/plugins/sampler.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast
from uuid import uuid4

from pydantic import ValidationError
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.prompt import SEARCH_TOOL_SCHEMA, format_observation, queries_from_arguments
from searchrl.retrieval.client import RetrievalClient, summarize_client_stats
from searchrl.trainer.plugins import metrics as m
from searchrl.trainer.plugins.tool_config import SearchToolConfig

log = logging.getLogger(__name__)

FAILURE_PREFIX = "search failed: "

_F = TypeVar("_F", bound=Callable[..., Any])


def _traced(func: _F) -> _F:
    """verl's `rollout_trace_op`, typed: unannotated there, it returns a functools.wraps wrapper of `func` taking
    the same arguments."""
    trace: Callable[[_F], Any] = rollout_trace_op
    return cast(_F, trace(func))


class SearchTool(BaseTool):
    """`search(query_list)` -> top-k passages per query, formatted as Search-R1-trained models read them."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        try:
            self.settings = SearchToolConfig.model_validate(config)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"bad search tool config in the tool YAML: {problems}") from None
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_TOOL_SCHEMA)
        super().__init__(config, schema)
        self._client: RetrievalClient | None = None
        self._instances: dict[str, dict[str, Any]] = {}
        self._stats_logged_at = time.monotonic()

    def _get_client(self) -> RetrievalClient:
        if self._client is None:
            s = self.settings
            api_key = os.environ.get(s.api_key_env) if s.api_key_env else None
            self._client = RetrievalClient(
                s.retrieval_urls,
                api_key or None,
                timeout_s=s.timeout_s,
                connect_timeout_s=s.connect_timeout_s,
                pool_timeout_s=s.pool_timeout_s,
                max_retries=s.max_retries,
                backoff_base_s=s.backoff_base_s,
                backoff_max_s=s.backoff_max_s,
            )
        return self._client

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = dict(kwargs.get("create_kwargs") or {})
        return instance_id, ToolResponse()

    @_traced  # as on BaseTool.execute: searches show up in verl's rollout traces (weave/mlflow)
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        started = time.perf_counter()
        metrics: dict[str, Any] = {"num_queries": 0, "num_hits": 0, "failed": 0, "error": ""}
        try:
            queries = queries_from_arguments(parameters)
        except ValueError as exc:
            text = f"{FAILURE_PREFIX}bad arguments: {exc}"
            metrics.update(failed=1, error="bad_arguments")
        else:
            metrics["num_queries"] = len(queries)
            try:
                hits = await self._get_client().search(queries, self.settings.topk)
            except RetrievalUnavailableError as exc:
                log.warning("search failed (%s): %s", exc.kind, exc)
                text = f"{FAILURE_PREFIX}{exc.kind}"
                metrics.update(failed=1, error=exc.kind)
            else:
                metrics["num_hits"] = sum(len(per_query) for per_query in hits)
                text = format_observation(
                    queries,
                    [[hit.contents for hit in per_query] for per_query in hits],
                    max_chars_per_doc=self.settings.passage_max_chars,
                    max_chars=self.settings.max_chars,
                )
        metrics["latency_s"] = time.perf_counter() - started
        _count(kwargs.get("agent_data"), metrics)
        self._log_client_stats()
        return ToolResponse(text=text), 0.0, metrics

    def _log_client_stats(self) -> None:
        """One INFO line per interval with the client's per-URL counters (sent, failed by kind, breaker), so a
        replica that fails or whose breaker keeps opening shows in the rollout workers' logs."""
        now = time.monotonic()
        if self._client is None or now - self._stats_logged_at < self.settings.stats_log_interval_s:
            return
        self._stats_logged_at = now
        log.info("retrieval client: %s", summarize_client_stats(self._client.stats()))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

    async def aclose(self) -> None:
        """Close the HTTP session (verl never calls this; tests and the eval loop do)."""
        if self._client is not None:
            await self._client.aclose()


def _count(agent_data: Any, metrics: dict[str, Any]) -> None:
    """Add this call to the trajectory's counters in the agent loop's extra_fields (see module docstring).

    Numbers and comma-separated strings only: verl stacks every extra field into a numpy object array.
    """
    fields = getattr(agent_data, "extra_fields", None)
    if not isinstance(fields, dict):
        return

    def add(key: str, value: float) -> None:
        fields[key] = fields.get(key, 0) + value

    def append(key: str, value: str) -> None:
        fields[key] = f"{fields[key]},{value}" if fields.get(key) else value

    add(m.CALLS, 1)
    add(m.FAILURES, metrics["failed"])
    add(m.QUERIES, metrics["num_queries"])
    add(m.RESULTS, metrics["num_hits"])
    add(m.EMPTY_CALLS, int(not metrics["failed"] and metrics["num_hits"] == 0))
    if metrics[
        "failed"
    ]:  # the kinds name the cause when the reward function stops the run (trainer/plugins/reward.py)
        append(m.FAILURE_KINDS, metrics["error"])
    add("search_latency_s", metrics["latency_s"])
    append(m.LATENCIES_MS, f"{metrics['latency_s'] * 1000:.1f}")


__all__ = ["FAILURE_PREFIX", "SearchTool"]
