"""Backpressure and graceful shutdown against a real uvicorn server on a loopback port."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.live import serve_in_thread
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch

pytestmark = pytest.mark.live

SETTINGS = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))


def _post(url: str, query: str) -> httpx.Response:
    return httpx.post(url + "/retrieve", json={"query": query, "topk": 2}, timeout=30)


def _wait_until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def test_503_with_retry_after_past_the_queue_bound_then_recovers() -> None:
    fn = HashedFlatSearch(TINY_CORPUS)
    fn.gate.clear()  # the worker blocks on its first batch, so the queue fills
    backend = BatchedBackend(fn, queue_size=3, batch_size=1, batch_wait_ms=0, cache_size=0)
    with serve_in_thread(create_app(SETTINGS, backend=backend)) as url, ThreadPoolExecutor(8) as pool:
        first = pool.submit(_post, url, "query zero")
        _wait_until(
            lambda: backend.batcher.in_flight == 1 and backend.batcher.queue_depth == 0
        )  # worker has it
        queued = [pool.submit(_post, url, f"query {i}") for i in range(1, 4)]
        _wait_until(lambda: backend.batcher.queue_depth == 3)
        over = _post(url, "one query too many")
        assert over.status_code == 503
        assert int(over.headers["Retry-After"]) >= 1
        assert "queue is full" in over.json()["detail"]
        fn.gate.set()
        assert [f.result().status_code for f in [first, *queued]] == [200] * 4
        assert _post(url, "after the burst").status_code == 200
        metrics = httpx.get(url + "/metrics").text
    assert 'searchrl_retrieval_errors_total{kind="overloaded"} 1.0' in metrics
    assert 'searchrl_retrieval_requests_total{status="503"} 1.0' in metrics


def test_shutdown_drains_in_flight_requests() -> None:
    # 0.5 s a batch: the 8 queries take ~2 s in 4 batches, so a waiter that sees them all submitted ~1 s late (a
    # loaded 2-core CI box once did, at 0.15 s a batch: 1 left in flight) still starts the shutdown mid-drain
    fn = HashedFlatSearch(TINY_CORPUS, delay_s=0.5)
    backend = BatchedBackend(fn, batch_size=2, batch_wait_ms=0, cache_size=0)
    queries = [f"Seventh Seal question {i}" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        with serve_in_thread(create_app(SETTINGS, backend=backend)) as url:
            futures = [pool.submit(_post, url, q) for q in queries]
            # all 8 are inside the service and a batch beyond the running one still waits when shutdown starts
            _wait_until(lambda: backend.batcher.submitted == 8)
            assert backend.batcher.in_flight >= 3
        # leaving the block = uvicorn's SIGTERM path (should_exit): stop accepting, finish in-flight, lifespan
        statuses = [f.result().status_code for f in futures]
    assert statuses == [200] * 8
    assert backend.closed
    assert sum(len(qs) for qs, _ in fn.calls) == 8
