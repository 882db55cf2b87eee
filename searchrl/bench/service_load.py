"""One load scenario against a running retrieval server: the scenario, its result, the query pool it draws from,
and `run_scenario`, which drives searchrl/bench/loadgen.py in a separate process and folds in /metrics and the
server's CPU and RSS (searchrl/bench/procfs.py)."""

from __future__ import annotations

import json
import logging
import math
import statistics
import subprocess
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from searchrl.bench.procfs import process_cpu_seconds, process_memory
from searchrl.errors import SearchRLError
from searchrl.retrieval.queries import DEV_QA, sample_queries

log = logging.getLogger(__name__)


@dataclass
class Scenario:
    name: str
    clients: int
    queries_per_request: int = 1
    repeat: int = 1  # each query sent this many times in a row
    # "stream": the shared request stream holds each query `repeat` times in a row, so concurrent clients send
    # the copies at once (GRPO's n samples of a prompt, rolled out together: in-flight de-duplication);
    # "client": each client sends its query `repeat` times, one after another (the result cache).
    repeat_mode: str = "stream"
    max_requests: int = 20_000
    seconds: float = 8.0
    client: str = "raw"  # load generator (searchrl/bench/loadgen.py): "raw" (wrk-like) or "aiohttp"


@dataclass
class LoadResult:
    name: str
    clients: int
    queries_per_request: int
    repeat: int
    requests: int = 0
    queries: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    qps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    dedup: int = 0
    mean_batch: float = 0.0
    client: str = "raw"
    client_cpu_ms_per_request: float = 0.0  # the load generator's CPU (getrusage) per answered request
    server_cpu_ms_per_request: float | None = None  # the server process's CPU (all threads), if measured
    server_rss_mb: float | None = None  # the server's RSS after the scenario (/proc/PID/smaps_rollup)
    server_anon_mb: float | None = None  # ... of which anonymous memory (heap, arenas, model weights)


# --- queries ------------------------------------------------------------------------------------------------
def bench_queries(corpus_path: Path, qa_path: Path | None = DEV_QA, *, seed: int = 0) -> list[str]:
    """Every distinct query the corpus yields (retrieval/queries.py: the same kind the encoder gate checks)."""
    return sample_queries(corpus_path, qa_path, seed=seed)


class QueryPool:
    """Hands out disjoint slices of the query list, so no scenario reuses another's queries."""

    def __init__(self, queries: list[str]) -> None:
        self.queries = queries
        self.pos = 0

    def take(self, n: int) -> list[str]:
        if self.pos + n > len(self.queries):
            raise SearchRLError(
                f"benchmark ran out of distinct queries ({len(self.queries)}); lower --seconds"
            )
        chunk = self.queries[self.pos : self.pos + n]
        self.pos += n
        return chunk

    @property
    def left(self) -> int:
        return len(self.queries) - self.pos


def scrape(url: str) -> dict[str, float]:
    """Counters and histogram sums of interest from GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels or sample.name.endswith(("_sum", "_count")):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(pct / 100.0 * len(ordered)) - 1))
    return ordered[idx]


def run_scenario(
    url: str, sc: Scenario, queries: list[str], *, server_pid: int | None = None, metrics: bool = True
) -> LoadResult:
    """Run one scenario in a fresh client process and fold in what /metrics saw meanwhile.

    With `server_pid`, the server's CPU seconds over the scenario are read from /proc, so the result says
    how much CPU the server and the load generator each spent per request, and its RSS after the scenario.
    `metrics=False` for a server without our /metrics (the reference-like one).
    """
    job = json.dumps({"url": url, "scenario": asdict(sc), "queries": queries})
    cmd = [sys.executable, "-c", "from searchrl.bench.loadgen import loadgen_main; loadgen_main()"]
    before = scrape(url) if metrics else {}
    server_cpu0 = process_cpu_seconds(server_pid) if server_pid else None
    done = subprocess.run(cmd, input=job.encode(), capture_output=True, timeout=sc.seconds + 120, check=False)
    server_cpu1 = process_cpu_seconds(server_pid) if server_pid else None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SearchRLError(f"load generator failed (exit {done.returncode}): {tail[0]}")
    raw = json.loads(done.stdout)
    after = scrape(url) if metrics else {}
    answered = max(1, raw["requests"])
    server_ms = (
        1000 * (server_cpu1 - server_cpu0) / answered
        if server_cpu0 is not None and server_cpu1 is not None
        else None
    )

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    lat = raw["latencies"]
    batches = delta("searchrl_retrieval_batch_size_count")
    res = LoadResult(
        name=sc.name,
        clients=sc.clients,
        queries_per_request=sc.queries_per_request,
        repeat=sc.repeat,
        requests=raw["requests"],
        queries=raw["queries"],
        errors=sum(raw["errors"].values()),
        error_kinds=raw["errors"],
        seconds=raw["seconds"],
        qps=raw["queries"] / raw["seconds"] if raw["seconds"] else 0.0,
        p50_ms=1000 * (statistics.median(lat) if lat else 0.0),
        p99_ms=1000 * _percentile(lat, 99),
        cache_hits=int(delta("searchrl_retrieval_cache_hits_total")),
        cache_misses=int(delta("searchrl_retrieval_cache_misses_total")),
        dedup=int(delta("searchrl_retrieval_dedup_total")),
        mean_batch=delta("searchrl_retrieval_batch_size_sum") / batches if batches else 0.0,
        client=sc.client,
        client_cpu_ms_per_request=1000 * raw["client_cpu_s"] / answered,
        server_cpu_ms_per_request=server_ms,
    )
    memory = process_memory(server_pid) if server_pid else None
    if memory is not None:
        res.server_rss_mb, res.server_anon_mb = memory["rss_mb"], memory["anon_mb"]
    log.info(
        "%s (%s client): %.0f queries/s, p50 %.0f ms, p99 %.0f ms, errors %d, CPU ms/request client %.3f "
        "server %s",
        sc.name,
        sc.client,
        res.qps,
        res.p50_ms,
        res.p99_ms,
        res.errors,
        res.client_cpu_ms_per_request,
        "-" if server_ms is None else f"{server_ms:.3f}",
    )
    return res


__all__ = ["LoadResult", "QueryPool", "Scenario", "bench_queries", "run_scenario", "scrape"]
