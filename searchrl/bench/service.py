"""Load benchmark of the dense retrieval service: in-process ceiling vs the running HTTP service.

    make bench                       # or: searchrl bench [--seconds 8] [--out outputs/bench]

One run measures, on the bundled 10k-passage corpus with the bundled MiniLM encoder and a Flat index (built
into data/ on first use, reused after):
  (a) today's ceiling: best in-process queries/s of batched encode + search + passage lookup (the dense
      backend's own batch function) on the torch fp32 encoder, over batch sizes, forward sizes and threads;
  (a') encoder workers: the same in-process measure of the encoder the service picked, with 1..N workers of
      one thread each (the scaling curve of issue 14; N = the cores here);
  (b) the service, started exactly as `searchrl serve` runs it (uvicorn in a subprocess on a free loopback
      port; it auto-tunes its encoder at start-up, measured afresh: the bench deletes the cached choice), at
      1, 32 and 128 concurrent clients sending one query per request, and 4 clients sending 32 queries per
      request: queries/s, p50/p99 latency, errors; plus the service's own report of every encoder candidate
      (recall@3 against the fp32 torch encoder on the dev QA + corpus-derived queries, q/s, refused or not);
  (c) 32 one-query clients where every query repeats 5 times in a row (GRPO's n samples per prompt);
  (h) the HTTP path alone: 128 clients re-sending the queries (b)@128 got answers for, so every one is a
      result-cache hit and no encoder runs: requests/s and CPU per request of server and load generator;
  (r) a reference-like server (searchrl/bench/reference.py: FastAPI, one fp32 torch encode + FAISS search per
      request, no batcher; what Search-R1's retrieval_server.py does) on the same model, FAISS file and
      corpus, at 1 and 128 one-query clients, so (b)@1 and (b)@128 are compared with it in the same run;
  (m) memory: the service's RSS after start-up and after every scenario, split into anonymous memory and
      file-backed pages (and of those, the pages of the mmap'd FAISS file, corpus and offsets), from
      /proc/PID/smaps; the reference-like server's RSS beside it.
Queries are distinct and realistic (the dev QA questions, then corpus titles and sentences turned into
questions), every scenario gets its own unused slice, so the result cache cannot serve (a)/(b): throughput is
on unique queries, with no cache hits, and the cache hits each scenario saw are read back from /metrics and
printed. Sizing (searchrl/bench/sizing.py): q/s per core, replicas for trainers of 8-64 GPUs, $/1M queries.

The load generator runs in a separate process (searchrl/bench/loadgen.py: a wrk-like raw HTTP/1.1 client by
default, the aiohttp client for one comparison row and (h); loopback only, bounded in requests and seconds), so
client and server do not share a GIL; every row reports both processes' CPU per request. Prints a table and the ratios the issue asks for, and writes JSON to
`outputs/bench/service-<timestamp>.json`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchrl.bench.procfs import process_memory
from searchrl.bench.service_inprocess import measure_ceiling, measure_e5_shape, measure_workers
from searchrl.bench.service_load import LoadResult, QueryPool, Scenario, bench_queries, run_scenario
from searchrl.processes import stop_process
from searchrl.retrieval.process import free_port, serve_command, start_ready
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


# --- (b), (c) the running service ---------------------------------------------------------------------------
def start_server(
    env_overrides: dict[str, str],
    port: int,
    log_path: Path,
    *,
    timeout_s: float = 300.0,
    backend: str = "dense",
) -> subprocess.Popen[bytes]:
    """`python -m searchrl serve` on 127.0.0.1:port; returns once GET /health answers."""
    cmd = serve_command(["--backend", backend], port)
    env = {**os.environ, **env_overrides}
    return start_ready(cmd, f"http://127.0.0.1:{port}", log_path, env=env, timeout_s=timeout_s)


def start_reference(
    settings: RetrievalSettings, port: int, log_path: Path, *, timeout_s: float = 300.0
) -> subprocess.Popen[bytes]:
    """The reference-like server (searchrl/bench/reference.py) on the service's model, FAISS file and corpus.

    It inherits this process's OMP_WAIT_POLICY (PASSIVE, set when the encoder module was imported), the same
    as the service gets: with the library default (spinning OpenMP threads) it answered one client in 300 to
    1,250 ms instead of 22 to 68 ms on this shared 2-core VM, and a reference that slow would flatter the service.
    """
    from searchrl.retrieval.encoders.encoder import resolve_encoder
    from searchrl.retrieval.index.build import FAISS_FILE, index_dir_for, resolve_corpus

    corpus = resolve_corpus(settings)
    _, model_dir = resolve_encoder(settings.encoder)
    cmd = [
        sys.executable,
        "-m",
        "searchrl.bench.reference",
        "--model",
        model_dir,
        "--index",
        str(index_dir_for(settings, "dense", corpus) / FAISS_FILE),
        "--corpus",
        str(corpus),
        "--port",
        str(port),
        "--max-length",
        str(settings.encoder_max_length),
    ]
    return start_ready(cmd, f"http://127.0.0.1:{port}", log_path, timeout_s=timeout_s)


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (uvicorn's graceful shutdown), as SkyServe does when it scales a replica down."""
    return stop_process(proc, grace_s=60)


def default_scenarios(seconds: float) -> list[Scenario]:
    return [
        Scenario("(b) 1 client x 1 query", 1, seconds=seconds),
        Scenario("(b) 32 clients x 1 query", 32, seconds=seconds),
        Scenario("(b) 128 clients x 1 query", 128, seconds=seconds),
        Scenario("(b) 4 clients x 32 queries", 4, queries_per_request=32, seconds=seconds),
        Scenario(
            "(c) 32 clients, 5x repeats, per client", 32, repeat=5, repeat_mode="client", seconds=seconds
        ),
        Scenario(
            "(c') 32 clients, 5x repeats, concurrent", 32, repeat=5, repeat_mode="stream", seconds=seconds
        ),
        # the client the benchmark used before issue 14, on the same kind of load, for comparison
        Scenario("(b) 128 clients x 1 query, aiohttp", 128, seconds=seconds, client="aiohttp"),
    ]


#: (r) the reference-like server (one encode + search per request, no batcher) at 1 and 128 clients.
REFERENCE = ("(r) reference-like, 1 client x 1 query", "(r) reference-like, 128 clients x 1 query")


def reference_scenarios(seconds: float) -> list[Scenario]:
    return [
        Scenario(name, clients, seconds=seconds) for name, clients in zip(REFERENCE, (1, 128), strict=True)
    ]


#: (h) the HTTP path alone: every query already in the result cache (no encoder work), both load generators.
HTTP_FLOOR = ("(h) 128 clients, cached queries, raw", "(h) 128 clients, cached queries, aiohttp")


def http_floor_scenarios(seconds: float) -> list[Scenario]:
    return [Scenario(name, 128, seconds=seconds, client=name.rsplit(" ", 1)[1]) for name in HTTP_FLOOR]


def _queries_for(sc: Scenario, pool: QueryPool, ceiling_qps: float) -> list[str]:
    # Enough distinct queries for the scenario at up to 3x the ceiling (6x for repeats served by the cache).
    budget = int(max(ceiling_qps, 100) * sc.seconds * (6 if sc.repeat > 1 else 3) / sc.repeat) + 64
    return pool.take(min(budget, pool.left // 2))


# --- the whole run ------------------------------------------------------------------------------------------
def run_bench(
    settings: RetrievalSettings,
    *,
    seconds: float = 8.0,
    ceiling_seconds: float = 3.0,
    out_dir: Path = Path("outputs/bench"),
    precisions: tuple[str, ...] = ("fp32",),
    batch_sizes: tuple[int, ...] = (32, 64, 128),
    forward_sizes: tuple[int, ...] = (16, 32),
    threads: tuple[int, ...] = (1, 2),
    server_threads: int = 0,
    e5_seconds: float = 2.0,
) -> dict[str, Any]:
    """Build/reuse the index, measure (a), start the service with the best precision, measure (b) and (c)."""
    load_before = os.getloadavg()[0]
    settings = settings.with_changes(**{"backend": "dense"})
    index_dir, mapped = _bench_index(settings)
    pool = QueryPool(bench_queries(mapped[-1]))
    log.info("benchmark: %d distinct queries available", len(pool.queries))

    ceiling_rows = measure_ceiling(
        settings,
        pool,
        precisions=precisions,
        batch_sizes=batch_sizes,
        forward_sizes=forward_sizes,
        threads=threads,
        seconds=ceiling_seconds,
    )
    best = max(ceiling_rows, key=lambda r: r["qps"])
    # The choice is measured in this run, on this machine now: drop cached choices (exports are kept).
    for stale in (index_dir / "encoders").glob("*/tuning-*.json"):
        stale.unlink()
    server_env = _server_env(settings, best["batch_size"], server_threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    reference_rows, reference_memory = run_reference(settings, pool, best["qps"], seconds, out_dir, stamp)
    service = _measure_service(
        server_env, pool, best["qps"], seconds, out_dir / f"server-{stamp}.log", mapped
    )
    service.memory["reference"] = reference_memory
    tuning = service.described.get("encoder_tuning") or {}
    choice = tuning.get("choice") or {}
    scaling = measure_workers(settings, pool, choice, seconds=ceiling_seconds) if choice else []
    # In-process rows call the batch function directly (no result cache), so they may reuse queries.
    e5_rows = measure_e5_shape(pool.queries[:4096], seconds=e5_seconds) if e5_seconds > 0 else []
    results = service.results
    b128 = {r.name: r for r in results}["(b) 128 clients x 1 query"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ratios = _ratios(results, reference_rows, best["qps"], tuning)
    report = {
        "created_at": stamp,
        "machine": _machine(cores, tuning, load_before),
        "settings": {k: v for k, v in server_env.items() if k.startswith("SEARCHRL_RETRIEVAL_")},
        "ceiling": ceiling_rows,
        "ceiling_best": best,
        "encoder": {k: service.described.get(k) for k in ENCODER_KEYS},
        "encoder_tuning": tuning,
        "workers_scaling": scaling,
        "e5_shape": e5_rows,
        "server_startup_s": service.startup_s,
        "server_exit_code": service.exit_code,
        "server_stopped_gracefully": service.graceful,
        "service": [asdict(r) for r in results],
        "reference": [asdict(r) for r in reference_rows],
        "memory": service.memory,
        "ratios": ratios,
        "targets": _targets(ratios, b128, tuning),
        "sizing": _sizing(settings, b128, tuning, e5_rows, cores),
    }
    path = out_dir / f"service-{stamp}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report["path"] = str(path)
    return report


def _bench_index(settings: RetrievalSettings) -> tuple[Path, tuple[Path, Path, Path]]:
    """The dense index of the bench's corpus, built on first use: (its directory, the files the service mmaps:
    FAISS file, offsets, corpus), the corpus last."""
    from searchrl.retrieval.index.build import (
        FAISS_FILE,
        OFFSETS,
        ensure_index,
        index_dir_for,
        resolve_corpus,
    )

    ensure_index(settings, "dense")
    corpus_path = resolve_corpus(settings)
    index_dir = index_dir_for(settings, "dense", corpus_path)
    return index_dir, (index_dir / FAISS_FILE, index_dir / OFFSETS, corpus_path)


def _machine(cores: int, tuning: dict[str, Any], load_before: float) -> dict[str, Any]:
    """The machine the numbers are from, as the service's tuning saw it, and how busy it was before the run."""
    machine = tuning.get("machine") or {}
    return {
        "cpus": cores,
        "cpu": machine.get("cpu"),
        "fast_bf16": machine.get("fast_bf16"),
        "loadavg_1m_before": load_before,
    }


def _server_env(settings: RetrievalSettings, batch_size: int, server_threads: int) -> dict[str, str]:
    """The service's environment: the bench's index and corpus, the ceiling's best batch bound, no build.

    The service tunes its own encoder (backend, precision, workers, threads, forward batch) at start-up; the
    batch bound is the ceiling's best (a batch only fills that far when that many queries wait).
    """
    env = {
        "SEARCHRL_RETRIEVAL_DATA_DIR": str(settings.data_dir),
        "SEARCHRL_RETRIEVAL_CORPUS": settings.corpus,
        "SEARCHRL_RETRIEVAL_ENCODER": settings.encoder,
        "SEARCHRL_RETRIEVAL_INDEX_TYPE": settings.index_type,
        "SEARCHRL_RETRIEVAL_BATCH_SIZE": str(batch_size),
        "SEARCHRL_RETRIEVAL_BATCH_WAIT_MS": str(settings.batch_wait_ms),
        "SEARCHRL_RETRIEVAL_BUILD_IF_MISSING": "false",
        "SEARCHRL_LOG_LEVEL": "WARNING",
    }
    if server_threads:
        env["SEARCHRL_RETRIEVAL_THREADS"] = str(server_threads)
    return env


@dataclass
class _ServiceRun:
    """What the service answered and did over (b), (c), (h) and (m)."""

    described: dict[str, Any]  # its GET / answer: the encoder it picked at start-up and that tuning
    results: list[LoadResult]
    memory: dict[str, Any]  # process_memory after start-up and at the end (run_bench adds the reference's)
    startup_s: float
    exit_code: int
    graceful: bool  # its log says the graceful shutdown completed


def _measure_service(
    server_env: dict[str, str],
    pool: QueryPool,
    ceiling_qps: float,
    seconds: float,
    log_path: Path,
    mapped: tuple[Path, ...],
) -> _ServiceRun:
    """(b), (c), (h) and (m) on the service, started as `searchrl serve` runs it and stopped after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = start_server(server_env, port, log_path)
    startup_s = time.perf_counter() - t0
    memory: dict[str, Any] = {"service_after_start": process_memory(proc.pid, mapped)}
    try:
        with urllib.request.urlopen(url + "/", timeout=10) as resp:
            described = json.loads(resp.read())
        results = _run_service_scenarios(url, proc.pid, pool, ceiling_qps, seconds)
        memory["service_at_end"] = process_memory(proc.pid, mapped)
    finally:
        rc = stop_server(proc)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so the exit status is -15; its log says whether
    # the shutdown (in-flight requests, then the lifespan: backend.close() draining the batcher) completed.
    server_log = log_path.read_text(encoding="utf-8", errors="replace")
    return _ServiceRun(described, results, memory, startup_s, rc, "Finished server process" in server_log)


def _run_service_scenarios(
    url: str, server_pid: int, pool: QueryPool, ceiling_qps: float, seconds: float
) -> list[LoadResult]:
    """The (b)/(c) scenarios on unused queries, then (h) on the queries (b)@128 left in the result cache."""
    from tqdm import tqdm

    scenarios = default_scenarios(seconds)
    floor = http_floor_scenarios(seconds)
    results: list[LoadResult] = []
    cached: list[str] = []
    for sc in tqdm([*scenarios, *floor], desc="service scenarios", unit="scenario", file=sys.stderr):
        if sc in floor:  # the queries (b)@128 got answers for are in the result cache now
            results.append(run_scenario(url, sc, cached * 200, server_pid=server_pid))
            continue
        queries = _queries_for(sc, pool, ceiling_qps)
        results.append(run_scenario(url, sc, queries, server_pid=server_pid))
        if sc.name == "(b) 128 clients x 1 query":
            cached = queries[: max(1, results[-1].requests)]
    return results


def _ratios(
    results: list[LoadResult], reference_rows: list[LoadResult], ceiling_qps: float, tuning: dict[str, Any]
) -> dict[str, float]:
    """The ratios the issues ask for: the service against the reference-like server, the ceiling and itself."""
    by_name = {r.name: r for r in results}
    b1 = by_name["(b) 1 client x 1 query"]
    r1, r128 = (next(r for r in reference_rows if r.name == name) for name in REFERENCE)
    b32 = by_name["(b) 32 clients x 1 query"]
    b128 = by_name["(b) 128 clients x 1 query"]
    c32 = by_name["(c) 32 clients, 5x repeats, per client"]
    c32_concurrent = by_name["(c') 32 clients, 5x repeats, concurrent"]
    queueing_bound_ms = 1000 * 128 / b128.qps if b128.qps else float("inf")
    return {
        # the lone client (issue 24): the service against a server with no batcher, same run, same machine
        "b1_over_reference": b1.qps / r1.qps if r1.qps else 0.0,
        "b1_p50_over_reference": b1.p50_ms / r1.p50_ms if r1.p50_ms else 0.0,
        "b128_over_reference": b128.qps / r128.qps if r128.qps else 0.0,
        "b128_over_ceiling": b128.qps / ceiling_qps,
        "b128_p99_over_queueing_bound": b128.p99_ms / queueing_bound_ms,
        "c_over_b32": c32.qps / b32.qps if b32.qps else 0.0,
        "c_concurrent_over_b32": c32_concurrent.qps / b32.qps if b32.qps else 0.0,
        # how much of the encoder's own in-process rate (measured by the service at start-up) reaches clients
        "b128_over_tuned_encoder": b128.qps / float(tuning["qps"]) if tuning.get("qps") else 0.0,
    }


def _targets(ratios: dict[str, float], b128: LoadResult, tuning: dict[str, Any]) -> dict[str, bool]:
    """Each target the issues set, by name, and whether this run met it."""
    servable = [c for c in tuning.get("candidates", []) if c.get("status") == "ok"]
    return {
        "(b) 1x1 >= 1.0x the reference-like server's 1x1": ratios["b1_over_reference"] >= 1.0,
        "b128 >= 2x fp32 in-process ceiling": ratios["b128_over_ceiling"] >= 2.0,
        "b128 p99 <= 1.3 x 128/(q/s)": ratios["b128_p99_over_queueing_bound"] <= 1.3,
        "b128 zero errors": b128.errors == 0,
        "b128 no cache hits (unique queries)": b128.cache_hits == 0,
        "recall@3 >= 0.99 for every servable encoder": bool(servable)
        and all((c.get("recall@3") or 0) >= 0.99 for c in servable),
        "(c) >= 3x (b)@32": ratios["c_over_b32"] >= 3.0,
    }


def _sizing(
    settings: RetrievalSettings,
    b128: LoadResult,
    tuning: dict[str, Any],
    e5_rows: list[dict[str, Any]],
    cores: int,
) -> list[dict[str, Any]]:
    """Replicas and $/1M queries (searchrl/bench/sizing.py) from this run's measured rates.

    The service's own q/s for MiniLM; for E5-base the best encoder-only rate scaled by the service's own
    service/in-process ratio (HTTP, batching and FAISS overheads measured on MiniLM in this run).
    """
    from searchrl.bench.sizing import PRICES, sizing_table

    choice = tuning.get("choice") or {}
    measured = {f"{settings.encoder} {choice.get('candidate', '?')} (service)": b128.qps}
    if e5_rows and tuning.get("qps"):
        best_e5 = max(e5_rows, key=lambda r: r["qps"])
        overhead = b128.qps / float(tuning["qps"])
        measured[f"e5-base shape {best_e5['candidate']} (est.)"] = best_e5["qps"] * min(1.0, overhead)
    return sizing_table(measured, cores=cores, price=PRICES["c7a.4xlarge"])


def run_reference(
    settings: RetrievalSettings,
    pool: QueryPool,
    ceiling_qps: float,
    seconds: float,
    out_dir: Path,
    stamp: str,
) -> tuple[list[LoadResult], dict[str, float] | None]:
    """(r): the reference-like server at 1 and 128 clients on unused queries, then its RSS; stopped after."""
    port = free_port()
    proc = start_reference(settings, port, out_dir / f"reference-{stamp}.log")
    url = f"http://127.0.0.1:{port}"
    rows: list[LoadResult] = []
    try:
        # warm-up (first calls allocate; the service's start-up tuning warms its own encoder)
        run_scenario(
            url, Scenario("warm-up", 1, max_requests=20, seconds=seconds), pool.take(20), metrics=False
        )
        for sc in reference_scenarios(seconds):
            rows.append(
                run_scenario(url, sc, _queries_for(sc, pool, ceiling_qps), server_pid=proc.pid, metrics=False)
            )
        memory = process_memory(proc.pid)
    finally:
        stop_server(proc)
    return rows, memory


ENCODER_KEYS = (
    "encoder_backend",
    "precision",
    "encoder_workers",
    "threads_per_worker",
    "forward_batch_size",
    "model_fingerprint",
)

__all__ = [
    "ENCODER_KEYS",
    "HTTP_FLOOR",
    "REFERENCE",
    "default_scenarios",
    "run_bench",
    "run_reference",
    "start_reference",
    "start_server",
    "stop_server",
]
