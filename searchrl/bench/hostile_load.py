"""Issue 26's reliability scenario: hostile result pages in page mode, /health latency and RSS growth meanwhile.

The hostile web itself (the pages, the fake Serper endpoint) is searchrl/bench/hostile_web.py.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from searchrl.bench.procfs import reset_peak_rss, vm_status
from searchrl.bench.reliability_load import Outcome
from searchrl.bench.replicas import Replica
from searchrl.retrieval.process import free_port
from searchrl.retrieval.settings import RetrievalSettings

#: the issue's bound: /health answers within 250 ms while pages are being fetched and parsed
HOSTILE_HEALTH_P99_MS = 250.0
#: fixed part of the RSS bound: the parse thread pool's stacks and malloc arenas, the ordinary pages being parsed,
#: the page client's TLS context
HOSTILE_RSS_MARGIN_MB = 64.0
#: what one connection may read ahead of the fetcher: uvloop (uvicorn's loop) reads up to 32 x 256 KiB per
#: wake-up before anyio, under httpx, pauses the socket again
HOSTILE_READ_AHEAD_MB = 8.0


def hostile_rss_bound_mb(in_flight: int, page_max_bytes: int) -> float:
    """RSS growth allowed while `in_flight` hostile pages are fetched: per page 2 x the cap plus the read-ahead,
    plus the fixed margin (158.5 MB at the defaults: 8 pages, 2 MB cap).

    A page in flight holds at most cap + 1 decoded bytes (pages.PageFetcher stops there) in a bytearray that,
    while it grows, may briefly exist twice (old and new buffer during a realloc), and its connection holds what
    the transport read ahead. None of it grows with the page: before issue 26 one 400 MiB page alone cost
    +1.6 GB, so the bound tells "capped" from "not capped" by 10x.
    """
    per_page = 2 * page_max_bytes / 2**20 + HOSTILE_READ_AHEAD_MB
    return round(in_flight * per_page + HOSTILE_RSS_MARGIN_MB, 1)


def judge_hostile(
    row: dict[str, Any],
    *,
    health_p99_ms: float = HOSTILE_HEALTH_P99_MS,
    rss_bound_mb: float | None = None,
    retrieve_max_s: float | None = None,
) -> list[str]:
    """The bounds the hostile row must keep, as one line per bound it broke (empty: passed)."""
    rss_bound = row["rss_bound_mb"] if rss_bound_mb is None else rss_bound_mb
    max_s = row["retrieve_limit_s"] if retrieve_max_s is None else retrieve_max_s
    failed = []
    if not row["health_p99_ms"] < health_p99_ms:
        failed.append(f"/health p99 {row['health_p99_ms']} ms >= {health_p99_ms:g} ms")
    if row["health_errors"]:
        failed.append(f"{row['health_errors']} /health probes failed")
    if not row["rss_growth_mb"] < rss_bound:
        failed.append(f"RSS grew {row['rss_growth_mb']} MB >= {rss_bound:g} MB")
    if row["http_5xx"]:
        failed.append(f"{row['http_5xx']} 5xx answers from /retrieve")
    if row["lost"] or row["wrong"]:
        failed.append(
            f"{row['lost']} calls lost, {row['wrong']} with hostile page text instead of the snippet"
        )
    if not row["max_s"] < max_s:
        failed.append(f"slowest /retrieve {row['max_s']} s >= {max_s:g} s")
    return failed


def hostile_pages(
    workdir: Path,
    *,
    seconds: float = 25.0,
    in_flight: int = 8,
    page_max_bytes: int = 2_000_000,
    page_timeout_s: float = 5.0,
    health_every_s: float = 0.05,
    health_p99_ms: float = HOSTILE_HEALTH_P99_MS,
    rss_bound_mb: float | None = None,
) -> dict[str, Any]:
    """Issue 26: the service (serper backend, page mode, private addresses allowed so it reaches the loopback
    hostile web) with `in_flight` concurrent /retrieve calls for `seconds`, each call's first result a hostile
    page (400 MiB of HTML, a gzip bomb inflating to 1 GiB, one byte a second, an endless redirect chain: worker
    w always asks for kind w mod 4) and its second an ordinary 200 KiB article; /health timed every
    `health_every_s`; the server's RSS sampled from /proc every 10 ms. The row says whether the bounds held
    (`judge_hostile`): /health p99, RSS growth, no 5xx, no hostile text in an answer, every call within the
    request deadline + 2 s."""
    from pydantic import SecretStr

    from searchrl.bench.hostile_web import HOSTILE_PAGES, SERPER_KEY, serve_hostile_web

    workdir.mkdir(parents=True, exist_ok=True)
    settings = RetrievalSettings(
        backend="serper", data_dir=workdir / "data", serper_api_key=SecretStr(SERPER_KEY)
    )
    bound = hostile_rss_bound_mb(in_flight, page_max_bytes) if rss_bound_mb is None else rss_bound_mb
    with serve_hostile_web(free_port(), workdir / "hostile-web.log") as web:
        env = _hostile_env(web, SERPER_KEY, page_max_bytes, page_timeout_s)
        r = Replica(settings, workdir / "service.log", env=env).start()
        try:
            assert r.proc is not None
            pid = r.proc.pid
            _warm_up(r.url)
            rss_base = vm_status(pid)["VmRSS"]
            hwm_reset = reset_peak_rss(pid)
            load = _HostileLoad(r.url, pid, list(HOSTILE_PAGES), health_every_s, rss_sampled=rss_base)
            load.run(seconds, in_flight)
            vm = vm_status(pid)
            metrics = httpx.get(r.url + "/metrics", timeout=10).text
        finally:
            r.stop()
    out = load.out
    row = out.row(
        scenario=f"{in_flight} hostile pages in flight {seconds:g}s (page mode, cap {page_max_bytes / 1e6:g} MB)",
        http_5xx=sum(n for k, n in out.errors.items() if k.startswith("http_5")),
        calls_by_kind=dict(load.per_kind),
        ordinary_pages=dict(load.pages_used),
        page_failures=_page_failures(metrics),
        **_health_fields(load.health, load.health_errors),
        **_rss_fields(rss_base, load.rss_sampled, vm, hwm_reset=hwm_reset, bound_mb=bound),
        health_limit_ms=health_p99_ms,
        retrieve_limit_s=settings.request_timeout_s + 2.0,
    )
    row["failed"] = judge_hostile(row, health_p99_ms=health_p99_ms)
    row["passed"] = not row["failed"]
    return row


def _hostile_env(web: str, key: str, page_max_bytes: int, page_timeout_s: float) -> dict[str, str]:
    """The service's environment: serper pointed at the hostile web, page mode with the cap under test, and no
    cache, rate limit or budget that would spare it a page."""
    return {
        "SERPER_API_KEY": key,  # both names: one from the caller's environment must not win
        "SEARCHRL_RETRIEVAL_SERPER_API_KEY": key,
        "SEARCHRL_RETRIEVAL_SERPER_BASE_URL": f"{web}/search",
        "SEARCHRL_RETRIEVAL_WEB_PAGE_MODE": "true",
        "SEARCHRL_RETRIEVAL_WEB_PAGE_ALLOW_PRIVATE": "true",  # the hostile web is on loopback
        "SEARCHRL_RETRIEVAL_WEB_PAGE_MAX_BYTES": str(page_max_bytes),
        "SEARCHRL_RETRIEVAL_WEB_PAGE_TIMEOUT_S": str(page_timeout_s),
        "SEARCHRL_RETRIEVAL_WEB_RATE_LIMIT_RPS": "0",
        "SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET": "0",
        "SEARCHRL_RETRIEVAL_CACHE_SIZE": "0",
        "SEARCHRL_RETRIEVAL_CACHE_MODE": "off",
    }


def _warm_up(url: str) -> None:
    """A few ordinary calls first, so the page client and parse threads exist before the RSS baseline is read."""
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(4):
            c.post("/retrieve", json={"queries": [f"warm {i} seventh seal"], "topk": 2})
    time.sleep(0.5)


@dataclass
class _HostileLoad:
    """One hostile run's threads and what they saw: `in_flight` /retrieve workers, a /health prober and an RSS
    sampler, the workers' counters shared under one lock."""

    url: str
    pid: int  # the service's, for the RSS samples
    kinds: list[str]  # hostile page kinds: worker w always asks for kinds[w mod len]
    health_every_s: float
    rss_sampled: int  # the highest VmRSS sampled, from the baseline up
    out: Outcome = field(default_factory=Outcome)
    per_kind: Counter[str] = field(default_factory=Counter)
    pages_used: Counter[str] = field(default_factory=Counter)  # second results: "ordinary" page or "snippet"
    health: list[float] = field(default_factory=list)  # seconds per /health probe
    health_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)  # workers send no new call
    calls_done: threading.Event = field(default_factory=threading.Event)  # watchers stop

    def run(self, seconds: float, in_flight: int) -> None:
        """Load for `seconds`, then let the calls in flight finish (a dripping page within its page timeout)
        while /health and RSS are still watched."""
        watchers = [threading.Thread(target=self.prober), threading.Thread(target=self.sampler)]
        workers = [threading.Thread(target=self.worker, args=(w,)) for w in range(in_flight)]
        for t in watchers + workers:
            t.start()
        time.sleep(seconds)
        self.stop.set()
        for t in workers:
            t.join()
        self.calls_done.set()
        for t in watchers:
            t.join()

    def worker(self, w: int) -> None:
        kind = self.kinds[w % len(self.kinds)]
        i = 0
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                self.call(c, kind, f"{kind} {w}-{i} seventh seal knight chess")
                i += 1

    def call(self, c: httpx.Client, kind: str, q: str) -> None:
        """One /retrieve whose first result is a `kind` hostile page; counted as lost, an error, kept or wrong."""
        started = time.monotonic()
        try:
            resp = c.post("/retrieve", json={"queries": [q], "topk": 2})
        except httpx.HTTPError as exc:
            with self.lock:
                self.out.sent += 1
                self.out.lost += 1
                self.out.errors[type(exc).__name__] += 1
            return
        took = time.monotonic() - started
        docs = resp.json()["result"][0] if resp.status_code == 200 else []
        texts = [str(d.get("contents", "")) for d in docs]
        kept = len(texts) == 2 and f"{kind} snippet" in texts[0]
        with self.lock:
            self.out.sent += 1
            self.per_kind[kind] += 1
            self.out.latencies.append(took)
            if resp.status_code != 200:
                self.out.errors[f"http_{resp.status_code}"] += 1
            elif kept:
                self.out.answered += 1
                self.pages_used["ordinary" if "ordinary snippet" not in texts[1] else "snippet"] += 1
            else:
                self.out.wrong += 1

    def prober(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as c:
            while not self.calls_done.is_set():
                started = time.perf_counter()
                try:
                    ok = c.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                took = time.perf_counter() - started
                self.health.append(took)
                self.health_errors += 0 if ok else 1
                time.sleep(max(0.0, self.health_every_s - took))

    def sampler(self) -> None:
        while not self.calls_done.is_set():
            self.rss_sampled = max(self.rss_sampled, vm_status(self.pid)["VmRSS"])
            time.sleep(0.01)


def _page_failures(metrics: str) -> dict[str, int]:
    """The service's page failures by reason, read from its /metrics text."""
    return {
        m.group(1): int(float(m.group(2)))
        for m in re.finditer(
            r'searchrl_retrieval_web_page_failures_total\{reason="(\w+)"\} ([0-9.e+]+)', metrics
        )
    }


def _health_fields(health: list[float], errors: int) -> dict[str, Any]:
    """The row's /health columns: probes, failed probes, p50, p99 and max in ms."""
    hs = sorted(health)

    def ms(q: float) -> float:
        return round(hs[min(len(hs) - 1, int(q * len(hs)))] * 1000, 1) if hs else 0.0

    return {
        "health_probes": len(hs),
        "health_errors": errors,
        "health_p50_ms": ms(0.50),
        "health_p99_ms": ms(0.99),
        "health_max_ms": round(hs[-1] * 1000, 1) if hs else 0.0,
    }


def _rss_fields(
    rss_base: int, rss_sampled: int, vm: dict[str, int], *, hwm_reset: bool, bound_mb: float
) -> dict[str, Any]:
    """The row's RSS columns in MB: the peak is VmHWM where the kernel let it be reset, else the 10 ms samples."""
    rss_peak = max(rss_sampled, vm["VmHWM"] if hwm_reset else 0)
    return {
        "rss_base_mb": round(rss_base / 2**20, 1),
        "rss_peak_mb": round(rss_peak / 2**20, 1),
        "rss_growth_mb": round((rss_peak - rss_base) / 2**20, 1),
        "rss_bound_mb": bound_mb,
        "rss_after_mb": round(vm["VmRSS"] / 2**20, 1),
        "rss_peak_from": "VmHWM" if hwm_reset and vm["VmHWM"] >= rss_sampled else "VmRSS samples",
    }


__all__ = ["HOSTILE_HEALTH_P99_MS", "hostile_pages", "hostile_rss_bound_mb", "judge_hostile"]
