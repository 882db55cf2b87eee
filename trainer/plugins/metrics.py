"""Search metrics for one training step, from the per-trajectory counters the search tool keeps.

verl 0.9.1 logs a fixed set of metrics per training step (`compute_data_metrics`, timing, actor): the metrics
dict a tool's `execute()` returns is dropped by ToolAgentLoop, and reward extras (`reward_extra_info`) are
aggregated for validation only. What does reach the trainer for every step is each trajectory's
`extra_fields` dict, stored with the sample. `SearchTool` adds its counters there (`trainer/plugins/tool.py`), and the
replay buffer in `trainer/plugins/sampler.py` turns a step's worth of them into the metrics below, which
verl's `Tracking.log` sends to the console and, when WANDB_API_KEY is set, to W&B:

    search/trajectories             trajectories in the step (verl's batch-size padding left out)
    search/calls                    search calls in the step (each may carry several queries)
    search/calls_per_trajectory     mean over the step's trajectories
    search/trajectories_searched    share of trajectories with at least one call
    search/queries                  queries sent to /retrieve
    search/failures                 failed calls; search/failure_rate = failures / calls
    search/failures/<kind>          by kind: timeout, connect, pool, malformed, http_<status>, bad_arguments
    search/latency_ms_p50|p95|max   per call, as the tool saw it (retries and back-off included)
    search/results_per_query        passages returned per query (top-k when every query finds k)
    search/empty_calls              calls that succeeded with no passage at all
    search/scripted_calls           calls the CPU runs' scripted first turn made (environment, loss mask 0;
                                    trainer/plugins/agent_loop.py); 0 on a GPU run
    search/model_calls              calls the model wrote itself: calls - scripted_calls

This module imports nothing from verl: it is a pure function over plain dicts, so it is tested directly and
the same numbers can be computed from a rollout dump.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

# Keys SearchTool writes into a trajectory's extra_fields (trainer/plugins/tool.py). Lists would not survive verl's
# stacking into numpy object arrays, so per-call values are comma-separated strings.
CALLS = "search_calls"
FAILURES = "search_failures"
FAILURE_KINDS = "search_failure_kinds"  # "timeout,connect"
QUERIES = "search_queries"
RESULTS = "search_results"
EMPTY_CALLS = "search_empty_calls"
LATENCIES_MS = "search_latencies_ms"  # "12.5,40.1"
# Written by the CPU runs' agent loop (trainer/plugins/agent_loop.py) for the calls it scripted.
SCRIPTED_CALLS = "search_scripted_calls"

# Always logged (0 when absent), so a W&B panel has a line from step 1, not only once a failure happens.
BASE_FAILURE_KINDS = ("timeout", "connect", "pool", "malformed", "http_429", "http_503", "bad_arguments")
PREFIX = "search/"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float | np.number) and not isinstance(value, bool) else 0.0


def _split(value: Any) -> list[str]:
    return [part for part in value.split(",") if part] if isinstance(value, str) else []


def search_step_metrics(extra_fields: Iterable[Mapping[str, Any] | None]) -> dict[str, float]:
    """The `search/*` metrics of one step from its trajectories' extra_fields (None or {} = no search).

    Counts are totals over the step; latency percentiles are over calls. With no call at all the counts are
    0 and the latency keys are left out (a percentile of nothing is not 0 ms).
    """
    rows = [dict(f) if isinstance(f, Mapping) else {} for f in extra_fields]
    calls_per_row = [_number(r.get(CALLS)) for r in rows]
    calls = sum(calls_per_row)
    failures = sum(_number(r.get(FAILURES)) for r in rows)
    queries = sum(_number(r.get(QUERIES)) for r in rows)
    results = sum(_number(r.get(RESULTS)) for r in rows)
    kinds: Counter[str] = Counter({k: 0 for k in BASE_FAILURE_KINDS})
    latencies: list[float] = []
    for r in rows:
        kinds.update(_split(r.get(FAILURE_KINDS)))
        for part in _split(r.get(LATENCIES_MS)):
            try:
                latencies.append(float(part))
            except ValueError:
                continue
    n = len(rows)
    out: dict[str, float] = {
        f"{PREFIX}trajectories": float(n),
        f"{PREFIX}calls": calls,
        f"{PREFIX}calls_per_trajectory": calls / n if n else 0.0,
        f"{PREFIX}trajectories_searched": sum(c > 0 for c in calls_per_row) / n if n else 0.0,
        f"{PREFIX}queries": queries,
        f"{PREFIX}failures": failures,
        f"{PREFIX}failure_rate": failures / calls if calls else 0.0,
        f"{PREFIX}results_per_query": results / queries if queries else 0.0,
        f"{PREFIX}empty_calls": sum(_number(r.get(EMPTY_CALLS)) for r in rows),
    }
    scripted = sum(_number(r.get(SCRIPTED_CALLS)) for r in rows)
    out[f"{PREFIX}scripted_calls"] = scripted
    out[f"{PREFIX}model_calls"] = max(calls - scripted, 0.0)
    for kind, count in sorted(kinds.items()):
        out[f"{PREFIX}failures/{kind}"] = float(count)
    if latencies:
        arr = np.asarray(latencies, dtype=float)
        out[f"{PREFIX}latency_ms_p50"] = float(np.percentile(arr, 50))
        out[f"{PREFIX}latency_ms_p95"] = float(np.percentile(arr, 95))
        out[f"{PREFIX}latency_ms_max"] = float(arr.max())
    return out


__all__ = [
    "BASE_FAILURE_KINDS",
    "CALLS",
    "EMPTY_CALLS",
    "FAILURES",
    "FAILURE_KINDS",
    "LATENCIES_MS",
    "QUERIES",
    "RESULTS",
    "SCRIPTED_CALLS",
    "search_step_metrics",
]
