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

import asyncio
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import SearchRLError
from searchrl.retrieval.process import free_port, serve_command, start_ready, stop_process
from searchrl.retrieval.queries import DEV_QA, sample_queries
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

TOPK = 3


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


# --- (a) ceiling ----------------------------------------------------------------------------------------------
def measure_ceiling(
    settings: RetrievalSettings,
    pool: QueryPool,
    *,
    precisions: tuple[str, ...] = ("fp32",),
    batch_sizes: tuple[int, ...] = (32, 64, 128),
    forward_sizes: tuple[int, ...] = (16, 32),
    threads: tuple[int, ...] = (1, 2),
    seconds: float = 3.0,
) -> list[dict[str, Any]]:
    """queries/s of the dense backend's batch function called directly, over a grid of configurations:
    precision x model threads x forward-pass size x batch size (queries per call).

    A precision whose first point runs at under half the best rate so far is measured at that point only
    (bf16 without AVX-512 BF16 is ~5x slower than fp32 here; its grid would take minutes).
    """
    # before torch/faiss load OpenMP: see retrieval/encoder.py (spinning threads starve everything else)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import faiss
    import torch

    from searchrl.retrieval.backends.dense import DenseBackend

    rows: list[dict[str, Any]] = []
    best = 0.0
    for precision in precisions:
        # today's path: the torch encoder, exactly as configured, no auto-tuning and one worker
        fixed = {"precision": precision, "encoder_backend": "torch", "autotune": False, "encoder_workers": 1}
        backend = DenseBackend(settings.model_copy(update=fixed))
        asyncio.run(backend.start())
        encoder = backend._encoder
        assert encoder is not None
        try:
            first = True
            for n_threads in threads:
                torch.set_num_threads(n_threads)
                faiss.omp_set_num_threads(n_threads)
                backend._search_sync(pool.take(8), TOPK)  # warm-up: first call allocates
                for fwd in forward_sizes:
                    encoder.batch_size = fwd
                    for bs in batch_sizes:
                        if bs < fwd:
                            continue
                        done = 0
                        started = time.perf_counter()
                        while True:
                            backend._search_sync(pool.take(bs), TOPK)
                            done += bs
                            elapsed = time.perf_counter() - started
                            if elapsed >= seconds:
                                break
                        qps = done / elapsed
                        rows.append(
                            {
                                "precision": precision,
                                "threads": n_threads,
                                "forward": fwd,
                                "batch_size": bs,
                                "qps": qps,
                                "queries": done,
                            }
                        )
                        log.info(
                            "ceiling %s, %d threads, forward %d, batch %d: %.0f queries/s",
                            precision,
                            n_threads,
                            fwd,
                            bs,
                            qps,
                        )
                        best = max(best, qps)
                        if first and qps < 0.5 * best:
                            break
                        first = False
                    else:
                        continue
                    break
                else:
                    continue
                log.info("ceiling: %s is too slow here; skipping the rest of its grid", precision)
                break
        finally:
            asyncio.run(backend.close())
    return rows


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
    from searchrl.retrieval.encoder import resolve_encoder
    from searchrl.retrieval.indexing import FAISS_FILE, index_dir_for, resolve_corpus

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
    return stop_process(proc, timeout_s=60)


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


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (stat(5))


def process_memory(pid: int, mapped: tuple[Path, ...] = ()) -> dict[str, float] | None:
    """RSS of a process in MB, split into anonymous and file-backed pages (Linux /proc; None elsewhere).

    `mapped_mb`: the resident pages of the given files (the mmap'd FAISS index, corpus, offsets), summed over
    their mappings in /proc/PID/smaps. Those are page cache the kernel can drop and share between processes;
    growth in `anon_mb` is the process's own memory (issue 24 item 4).
    """
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        smaps = Path(f"/proc/{pid}/smaps").read_text() if mapped else ""
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in rollup.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0])
    wanted = {str(p.resolve()) for p in mapped}
    mapped_kb = 0
    current = ""
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            current = head[5].strip() if len(head) > 5 else ""
        elif line.startswith("Rss:") and current in wanted:
            mapped_kb += int(line.split()[1])
    rss, anon = fields.get("Rss", 0), fields.get("Anonymous", 0)
    return {
        "rss_mb": rss / 1024,
        "anon_mb": anon / 1024,
        "file_mb": (rss - anon) / 1024,
        "mapped_mb": mapped_kb / 1024,
    }


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
    from searchrl.retrieval.indexing import FAISS_FILE, OFFSETS, ensure_index, index_dir_for, resolve_corpus

    load_before = os.getloadavg()[0]
    settings = settings.model_copy(update={"backend": "dense"})
    ensure_index(settings, "dense")
    corpus_path = resolve_corpus(settings)
    pool = QueryPool(bench_queries(corpus_path))
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
    index_dir = index_dir_for(settings, "dense", corpus_path)
    # The choice is measured in this run, on this machine now: drop cached choices (exports are kept).
    for cached in (index_dir / "encoders").glob("*/tuning-*.json"):
        cached.unlink()
    # The service tunes its own encoder (backend, precision, workers, threads, forward batch) at start-up;
    # the batch bound is the ceiling's best (a batch only fills that far when that many queries wait).
    server_env = {
        "SEARCHRL_RETRIEVAL_DATA_DIR": str(settings.data_dir),
        "SEARCHRL_RETRIEVAL_CORPUS": settings.corpus,
        "SEARCHRL_RETRIEVAL_ENCODER": settings.encoder,
        "SEARCHRL_RETRIEVAL_INDEX_TYPE": settings.index_type,
        "SEARCHRL_RETRIEVAL_BATCH_SIZE": str(best["batch_size"]),
        "SEARCHRL_RETRIEVAL_BATCH_WAIT_MS": str(settings.batch_wait_ms),
        "SEARCHRL_RETRIEVAL_BUILD_IF_MISSING": "false",
        "SEARCHRL_LOG_LEVEL": "WARNING",
    }
    if server_threads:
        server_env["SEARCHRL_RETRIEVAL_THREADS"] = str(server_threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    mapped = (index_dir / FAISS_FILE, index_dir / OFFSETS, corpus_path)
    reference_rows, reference_memory = run_reference(settings, pool, best["qps"], seconds, out_dir, stamp)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = start_server(server_env, port, out_dir / f"server-{stamp}.log")
    startup_s = time.perf_counter() - t0
    results: list[LoadResult] = []
    memory: dict[str, Any] = {"service_after_start": process_memory(proc.pid, mapped)}
    try:
        with urllib.request.urlopen(url + "/", timeout=10) as resp:
            described = json.loads(resp.read())
        from tqdm import tqdm

        scenarios = default_scenarios(seconds)
        floor = http_floor_scenarios(seconds)
        cached: list[str] = []
        for sc in tqdm([*scenarios, *floor], desc="service scenarios", unit="scenario", file=sys.stderr):
            if sc in floor:  # the queries (b)@128 got answers for are in the result cache now
                results.append(run_scenario(url, sc, cached * 200, server_pid=proc.pid))
                continue
            queries = _queries_for(sc, pool, best["qps"])
            results.append(run_scenario(url, sc, queries, server_pid=proc.pid))
            if sc.name == "(b) 128 clients x 1 query":
                cached = queries[: max(1, results[-1].requests)]
        memory["service_at_end"] = process_memory(proc.pid, mapped)
    finally:
        rc = stop_server(proc)
    memory["reference"] = reference_memory
    # uvicorn re-raises SIGTERM after its graceful shutdown, so the exit status is -15; its log says whether
    # the shutdown (in-flight requests, then the lifespan: backend.close() draining the batcher) completed.
    server_log = (out_dir / f"server-{stamp}.log").read_text(encoding="utf-8", errors="replace")
    graceful = "Finished server process" in server_log
    tuning = described.get("encoder_tuning") or {}
    choice = tuning.get("choice") or {}
    scaling = measure_workers(settings, pool, choice, seconds=ceiling_seconds) if choice else []
    # In-process rows call the batch function directly (no result cache), so they may reuse queries.
    e5_rows = measure_e5_shape(pool.queries[:4096], seconds=e5_seconds) if e5_seconds > 0 else []
    by_name = {r.name: r for r in results}
    b1 = by_name["(b) 1 client x 1 query"]
    r1, r128 = (next(r for r in reference_rows if r.name == name) for name in REFERENCE)
    b32 = by_name["(b) 32 clients x 1 query"]
    b128 = by_name["(b) 128 clients x 1 query"]
    c32 = by_name["(c) 32 clients, 5x repeats, per client"]
    c32_concurrent = by_name["(c') 32 clients, 5x repeats, concurrent"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    queueing_bound_ms = 1000 * 128 / b128.qps if b128.qps else float("inf")
    servable = [c for c in tuning.get("candidates", []) if c.get("status") == "ok"]
    ratios = {
        # the lone client (issue 24): the service against a server with no batcher, same run, same machine
        "b1_over_reference": b1.qps / r1.qps if r1.qps else 0.0,
        "b1_p50_over_reference": b1.p50_ms / r1.p50_ms if r1.p50_ms else 0.0,
        "b128_over_reference": b128.qps / r128.qps if r128.qps else 0.0,
        "b128_over_ceiling": b128.qps / best["qps"],
        "b128_p99_over_queueing_bound": b128.p99_ms / queueing_bound_ms,
        "c_over_b32": c32.qps / b32.qps if b32.qps else 0.0,
        "c_concurrent_over_b32": c32_concurrent.qps / b32.qps if b32.qps else 0.0,
        # how much of the encoder's own in-process rate (measured by the service at start-up) reaches clients
        "b128_over_tuned_encoder": b128.qps / float(tuning["qps"]) if tuning.get("qps") else 0.0,
    }
    targets = {
        "(b) 1x1 >= 1.0x the reference-like server's 1x1": ratios["b1_over_reference"] >= 1.0,
        "b128 >= 2x fp32 in-process ceiling": ratios["b128_over_ceiling"] >= 2.0,
        "b128 p99 <= 1.3 x 128/(q/s)": ratios["b128_p99_over_queueing_bound"] <= 1.3,
        "b128 zero errors": b128.errors == 0,
        "b128 no cache hits (unique queries)": b128.cache_hits == 0,
        "recall@3 >= 0.99 for every servable encoder": bool(servable)
        and all((c.get("recall@3") or 0) >= 0.99 for c in servable),
        "(c) >= 3x (b)@32": ratios["c_over_b32"] >= 3.0,
    }
    from searchrl.bench.sizing import PRICES, sizing_table

    # The service's own q/s for MiniLM; for E5-base the best encoder-only rate scaled by the service's own
    # service/in-process ratio (HTTP, batching and FAISS overheads measured on MiniLM in this run).
    measured = {f"{settings.encoder} {choice.get('candidate', '?')} (service)": b128.qps}
    if e5_rows and tuning.get("qps"):
        best_e5 = max(e5_rows, key=lambda r: r["qps"])
        overhead = b128.qps / float(tuning["qps"])
        measured[f"e5-base shape {best_e5['candidate']} (est.)"] = best_e5["qps"] * min(1.0, overhead)
    sizing = sizing_table(measured, cores=cores, price=PRICES["c7a.4xlarge"])
    report = {
        "created_at": stamp,
        "machine": {
            "cpus": cores,
            "cpu": (tuning.get("machine") or {}).get("cpu"),
            "fast_bf16": (tuning.get("machine") or {}).get("fast_bf16"),
            "loadavg_1m_before": load_before,
        },
        "settings": {k: v for k, v in server_env.items() if k.startswith("SEARCHRL_RETRIEVAL_")},
        "ceiling": ceiling_rows,
        "ceiling_best": best,
        "encoder": {k: described.get(k) for k in ENCODER_KEYS},
        "encoder_tuning": tuning,
        "workers_scaling": scaling,
        "e5_shape": e5_rows,
        "server_startup_s": startup_s,
        "server_exit_code": rc,
        "server_stopped_gracefully": graceful,
        "service": [asdict(r) for r in results],
        "reference": [asdict(r) for r in reference_rows],
        "memory": memory,
        "ratios": ratios,
        "targets": targets,
        "sizing": sizing,
    }
    path = out_dir / f"service-{stamp}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report["path"] = str(path)
    return report


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


def measure_e5_shape(
    queries: list[str], *, seconds: float = 2.0, batch_size: int = 128, forward: int = 32
) -> list[dict[str, Any]]:
    """Encoder-only queries/s of a BERT-base-shaped model (E5-base: 12 layers, 768 wide), per candidate.

    E5 weights cannot be downloaded here, so the model is randomly initialised with e5-base-v2's shape: the
    compute per query is the same, the vectors are meaningless (recall is measured on MiniLM, not here).
    """
    import tempfile

    from transformers import AutoTokenizer, BertConfig, BertModel

    from searchrl.retrieval.encoder import Encoder, bundled_minilm_path
    from searchrl.retrieval.encoder_pool import available_cores
    from searchrl.retrieval.encoder_tuning import _build, cpu_info, has_fast_bf16

    cores = len(available_cores())
    names = ["torch-fp32", "onnx-fp32"]
    if has_fast_bf16(cpu_info()["flags"]):
        names.insert(1, "torch-bf16")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="e5-shape-") as tmp:
        folder = Path(tmp) / "e5-base-shape"
        tokenizer = AutoTokenizer.from_pretrained(str(bundled_minilm_path()))  # the same uncased BERT vocab
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(folder)  # BERT-base defaults
        tokenizer.save_pretrained(folder)
        base = Encoder.load(str(folder), device="cpu", precision="fp32", batch_size=forward)
        for name in names:
            encoder = _build(name, base, Path(tmp), "e5-shape", cores, forward)
            encoder.encode_queries(queries[:batch_size])  # warm-up
            done, pos, started = 0, batch_size, time.perf_counter()
            while time.perf_counter() - started < seconds:
                encoder.encode_queries(queries[pos : pos + batch_size])
                pos, done = pos + batch_size, done + batch_size
            qps = done / (time.perf_counter() - started)
            rows.append({"candidate": name, "threads": cores, "qps": round(qps, 1)})
            log.info("E5-base shape %s, %d threads: %.0f queries/s (encoder only)", name, cores, qps)
    return rows


ENCODER_KEYS = (
    "encoder_backend",
    "precision",
    "encoder_workers",
    "threads_per_worker",
    "forward_batch_size",
    "model_fingerprint",
)


def measure_workers(
    settings: RetrievalSettings,
    pool: QueryPool,
    choice: dict[str, Any],
    *,
    seconds: float = 3.0,
    batch_size: int = 128,
) -> list[dict[str, Any]]:
    """In-process queries/s of the chosen encoder with 1..N workers of one thread each (N = usable cores).

    The dense backend's own batch function, as in (a), so the curve shows what workers add on this machine.
    """
    from searchrl.retrieval.backends.dense import DenseBackend

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    backend_name, precision = str(choice["candidate"]).split("-")
    rows: list[dict[str, Any]] = []
    for workers in range(1, cores + 1):
        fixed = {
            "autotune": False,
            "encoder_backend": backend_name,
            "precision": precision,
            "encoder_workers": workers,
            "threads": workers,  # one per worker
            "forward_batch_size": int(choice["forward_batch_size"]),
        }
        backend = DenseBackend(settings.model_copy(update=fixed))
        asyncio.run(backend.start())
        try:
            # the batch function has no cache, so cycling through queries the scenarios used is fair
            backend._search_sync(pool.queries[:batch_size], TOPK)  # warm-up
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                start = done % max(1, len(pool.queries) - batch_size)
                backend._search_sync(pool.queries[start : start + batch_size], TOPK)
                done += batch_size
            qps = done / (time.perf_counter() - started)
        finally:
            asyncio.run(backend.close())
        rows.append(
            {"candidate": choice["candidate"], "workers": workers, "threads": 1, "qps": round(qps, 1)}
        )
        log.info("workers scaling %s: %d x 1 thread: %.0f queries/s", choice["candidate"], workers, qps)
    return rows


def format_memory(memory: dict[str, Any]) -> str:
    """(m): the service's RSS after start-up and at the end, anonymous vs file-backed, and the reference's."""

    def one(m: dict[str, float] | None) -> str:
        if not m:
            return "-"
        mapped = f", {m['mapped_mb']:.0f} of it the mmap'd index/corpus/offsets" if "mapped_mb" in m else ""
        return f"{m['rss_mb']:.0f} MB (anon {m['anon_mb']:.0f}, file-backed {m['file_mb']:.0f}{mapped})"

    return (
        f"memory (RSS, /proc/PID/smaps): service after start-up {one(memory.get('service_after_start'))}; "
        f"after every scenario {one(memory.get('service_at_end'))} (the result cache included); "
        f"reference-like server {one(memory.get('reference'))}"
    )


def format_report(report: dict[str, Any]) -> str:
    """The table and ratios, as printed by `searchrl bench`."""
    lines = []
    header = (
        f"{'scenario':42} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'batch':>6} {'cached/dedup':>13}"
        f" {'CPU ms/req client/server':>25} {'RSS MB':>7}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for row in report["ceiling"]:
        name = f"(a) in-process {row['precision']} {row['threads']}thr fwd {row['forward']} batch {row['batch_size']}"
        lines.append(f"{name:42} {row['qps']:8.0f} {'':>8} {'':>8} {'':>7} {row['batch_size']:6d}")
    for r in [*report.get("reference", []), *report["service"]]:
        looked = r["cache_hits"] + r["cache_misses"]
        hit = f"{100 * r['cache_hits'] / looked:.0f}%/{100 * r['dedup'] / looked:.0f}%" if looked else "-"
        server = r.get("server_cpu_ms_per_request")
        cpu = f"{r.get('client_cpu_ms_per_request', 0):.3f} / {'-' if server is None else f'{server:.3f}'}"
        rss = "-" if r.get("server_rss_mb") is None else f"{r['server_rss_mb']:.0f}"
        lines.append(
            f"{r['name']:42} {r['qps']:8.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['errors']:7d} "
            f"{r['mean_batch']:6.1f} {hit:>13} {cpu:>25} {rss:>7}"
        )
    for row in report.get("workers_scaling", []):
        name = f"(a') in-process {row['candidate']} {row['workers']} workers x 1thr"
        lines.append(f"{name:42} {row['qps']:8.0f}")
    for row in report.get("e5_shape", []):
        name = f"(e5) encoder only, E5-base shape {row['candidate']}"
        lines.append(f"{name:42} {row['qps']:8.0f}")
    best = report["ceiling_best"]
    ratios = report["ratios"]
    enc = report.get("encoder") or {}
    tuning = report.get("encoder_tuning") or {}
    lines.append("")
    lines.append(
        f"ceiling (today's torch fp32, best in-process): {best['qps']:.0f} q/s ({best['threads']} threads, "
        f"forward {best['forward']}, batch {best['batch_size']}); all throughput is on unique queries (no "
        "cache hits) unless a row says otherwise"
    )
    lines.append(
        f"service encoder (auto-tuned at start-up): {enc.get('encoder_backend')} {enc.get('precision')}, "
        f"{enc.get('encoder_workers')} workers x {enc.get('threads_per_worker')} threads, forward "
        f"{enc.get('forward_batch_size')}, {tuning.get('qps', 0):.0f} q/s in-process; batch <= "
        f"{report['settings']['SEARCHRL_RETRIEVAL_BATCH_SIZE']}; start-up {report['server_startup_s']:.1f}s "
        f"(tuning {tuning.get('seconds', 0):.1f}s)"
    )
    machine = report.get("machine") or {}
    lines.append(
        f"machine: {machine.get('cpu')}, {machine.get('cpus')} cores, fast bf16 {machine.get('fast_bf16')}, "
        f"load average {machine.get('loadavg_1m_before', 0):.2f} before the run"
    )
    lines.append(
        f"encoder candidates (recall@3 vs fp32 torch on {tuning.get('gate_queries', 0)} dev+bench queries):"
    )
    for c in tuning.get("candidates", []):
        recall = "-" if c.get("recall@3") is None else f"{c['recall@3']:.3f}"
        qps = "-" if c.get("qps") is None else f"{c['qps']:.0f} q/s"
        lines.append(f"  {c['name']:10} recall@3 {recall:>6}  {qps:>9}  {c['status']}")
    reference = {r["name"]: r for r in report.get("reference", [])}
    service = {r["name"]: r for r in report["service"]}
    r1, b1 = reference.get(REFERENCE[0]), service.get("(b) 1 client x 1 query")
    if r1 and b1:
        lines.append(
            f"(b) 1 client / reference-like 1 client: {ratios['b1_over_reference']:.2f}x q/s, p50 "
            f"{b1['p50_ms']:.1f} vs {r1['p50_ms']:.1f} ms   (target >= 1.0x)"
        )
    r128, b128 = reference.get(REFERENCE[1]), service.get("(b) 128 clients x 1 query")
    if r128 and b128:
        lines.append(
            f"(b) 128 clients / reference-like 128 clients: {ratios['b128_over_reference']:.2f}x q/s, p99 "
            f"{b128['p99_ms']:.0f} vs {r128['p99_ms']:.0f} ms"
        )
    lines.append(f"(b) 128 clients / fp32 ceiling: {ratios['b128_over_ceiling']:.2f}x   (target >= 2x)")
    if "b128_p99_over_queueing_bound" in ratios:
        lines.append(
            f"(b) 128 clients p99 / (128 / q/s): {ratios['b128_p99_over_queueing_bound']:.2f}x   (target <= 1.3x)"
        )
    if ratios.get("b128_over_tuned_encoder"):
        lines.append(
            f"(b) 128 clients / the service's encoder in-process: {ratios['b128_over_tuned_encoder']:.2f}x   "
            "(what HTTP, batching and the event loop leave of the encoder's rate)"
        )
    lines.append(f"(c) 5x repeats per client / (b) 32 clients: {ratios['c_over_b32']:.1f}x   (target >= 3x)")
    lines.append(
        f"(c') 5x repeats sent concurrently / (b) 32 clients: {ratios['c_concurrent_over_b32']:.1f}x   (no target)"
    )
    lines.append(
        "load generators (searchrl/bench/loadgen.py, a separate process on the same cores): raw = wrk-like "
        "keep-alive HTTP/1.1 on uvloop + httptools, aiohttp = the client used before; both check status 200 "
        "and one result list per query on every response; CPU ms/req from getrusage (client) and /proc "
        "(server, all threads, encoder included)"
    )
    memory = report.get("memory") or {}
    if memory:
        lines.append(format_memory(memory))
    for name, ok in report["targets"].items():
        lines.append(f"  [{'x' if ok else ' '}] {name}")
    if report.get("sizing"):
        from searchrl.bench.sizing import format_sizing

        lines.append("")
        lines.append("sizing (searchrl/bench/sizing.py; assumptions in docs/sizing.md):")
        lines.append(format_sizing(report["sizing"]))
    lines.append(f"results: {report['path']}")
    return "\n".join(lines)


__all__ = [
    "REFERENCE",
    "Scenario",
    "bench_queries",
    "format_report",
    "measure_ceiling",
    "measure_workers",
    "process_memory",
    "run_bench",
    "start_reference",
]
