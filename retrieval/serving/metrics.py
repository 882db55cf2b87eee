"""Prometheus metrics of the retrieval service, served by `GET /metrics`.

Each app gets its own `CollectorRegistry` (not the process-global default one) so several apps in one process
(tests, the benchmark) never collide on metric names. Names follow Prometheus conventions
(https://prometheus.io/docs/practices/naming/): `_total` counters, `_seconds` histograms.

    searchrl_retrieval_requests_total{status}        /retrieve requests by HTTP status
    searchrl_retrieval_queries_total                 queries received in /retrieve requests
    searchrl_retrieval_errors_total{kind}            failed requests by kind (overloaded, backend, invalid, ...)
    searchrl_retrieval_request_seconds               /retrieve latency histogram
    searchrl_retrieval_batch_size                    queries per encoder/index batch
    searchrl_retrieval_batch_seconds                 time to compute one batch
    searchrl_retrieval_queue_depth                   queries waiting for the worker now
    searchrl_retrieval_queue_wait_seconds            time a query waits before its batch starts
    searchrl_retrieval_cache_hits_total / _misses_total   result-cache lookups
    searchrl_retrieval_dedup_total                   queries answered by an identical in-flight query
    searchrl_retrieval_ready                         1 when /ready answers 200 (watchdog, every second)
    searchrl_retrieval_web_page_failures_total{reason}  page-mode pages not used (retrieval/backends/web/pages.py REASONS)
    searchrl_retrieval_web_upstream_requests_total{provider,attempt}  requests sent to a web search provider,
                                                     attempt first|retry: each spends the daily budget
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_PREFIX = "searchrl_retrieval"
# Latency buckets span a cache hit (sub-millisecond) to a request stuck behind a full queue (seconds).
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class RetrievalMetrics:
    """All metrics of one app, in their own registry. Implements `searchrl.retrieval.serving.batcher.BatcherMetrics`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{_PREFIX}_requests", "/retrieve requests by HTTP status", ["status"], registry=r
        )
        self.queries = Counter(f"{_PREFIX}_queries", "queries received in /retrieve requests", registry=r)
        self.errors = Counter(f"{_PREFIX}_errors", "failed /retrieve requests by kind", ["kind"], registry=r)
        self.latency = Histogram(
            f"{_PREFIX}_request_seconds", "/retrieve latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            f"{_PREFIX}_batch_size", "queries per encoder/index batch", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            f"{_PREFIX}_batch_seconds", "time to compute one batch", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge(f"{_PREFIX}_queue_depth", "queries waiting for the worker", registry=r)
        self.queue_wait = Histogram(
            f"{_PREFIX}_queue_wait_seconds",
            "time a query waits before its batch starts",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_hits = Counter(f"{_PREFIX}_cache_hits", "result-cache hits", registry=r)
        self.cache_misses = Counter(f"{_PREFIX}_cache_misses", "result-cache misses", registry=r)
        self.dedup = Counter(
            f"{_PREFIX}_dedup", "queries answered by an identical query already in flight", registry=r
        )
        self.ready = Gauge(f"{_PREFIX}_ready", "1 when this replica passes its readiness checks", registry=r)
        self.web_page_failures = Counter(
            f"{_PREFIX}_web_page_failures",
            "web page-mode pages not used (snippet kept), by reason",
            ["reason"],
            registry=r,
        )
        self.web_upstream_requests = Counter(
            f"{_PREFIX}_web_upstream_requests",
            "requests sent to the web search provider (each spends the daily budget), first try or retry",
            ["provider", "attempt"],
            registry=r,
        )
        self._by_status: dict[int, Any] = {}  # labelled children, looked up once per status (hot path)

    def set_ready(self, ready: bool) -> None:
        self.ready.set(1 if ready else 0)

    # --- per request (app) ---------------------------------------------------------------------------------
    def observe_request(
        self, status: int, n_queries: int, seconds: float, error_kind: str | None = None
    ) -> None:
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self.requests.labels(status=str(status))
        child.inc()
        if n_queries:
            self.queries.inc(n_queries)
        self.latency.observe(seconds)
        if error_kind is not None:
            self.errors.labels(kind=error_kind).inc()

    # --- BatcherMetrics ------------------------------------------------------------------------------------
    def observe_batch(self, size: int, seconds: float) -> None:
        if size:
            self.batch_size.observe(size)
            self.batch_seconds.observe(seconds)

    def observe_queue_wait(self, seconds: Sequence[float]) -> None:
        for s in seconds:
            self.queue_wait.observe(s)

    def set_queue_depth(self, depth: int) -> None:
        self.queue_depth.set(depth)

    def count_cache(self, hits: int, misses: int) -> None:
        if hits:
            self.cache_hits.inc(hits)
        if misses:
            self.cache_misses.inc(misses)

    def count_dedup(self, n: int) -> None:
        self.dedup.inc(n)

    def count_page_failure(self, reason: str) -> None:
        self.web_page_failures.labels(reason=reason).inc()

    def count_upstream_request(self, provider: str, retry: bool) -> None:
        self.web_upstream_requests.labels(provider=provider, attempt="retry" if retry else "first").inc()

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "RetrievalMetrics"]
