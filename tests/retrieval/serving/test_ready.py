"""/ready under load and on a cold index, against the real server on a loopback port (issue 21 item 9).

SkyServe routes only to replicas whose probe (POST /ready) passes, and tears a replica down after 180 s of
failed probes. So /ready must fail for faults only: a replica that is saturated but still computing batches
stays ready and sheds with 503 + Retry-After at /retrieve; and a cold index is paged in by one warm-up query
before the replica ever reports ready, so the first real batch does not look like a stalled worker.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from searchrl.retrieval.api.lifespan import WARM_UP_QUERY
from searchrl.retrieval.backends.hybrid import HybridBackend
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.live import serve_in_thread
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch

pytestmark = pytest.mark.live

SETTINGS = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))


def _post(url: str, query: str) -> httpx.Response:
    return httpx.post(url + "/retrieve", json={"query": query, "topk": 2}, timeout=30)


def _wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_saturated_replica_that_works_stays_ready_and_sheds_at_retrieve() -> None:
    fn = HashedFlatSearch(TINY_CORPUS, delay_s=1.0)  # slow but working: every batch finishes (1 s each)
    backend = BatchedBackend(fn, queue_size=4, batch_size=1, batch_wait_ms=0, cache_size=0)
    with serve_in_thread(create_app(SETTINGS, backend=backend)) as url, ThreadPoolExecutor(12) as pool:
        calls = [pool.submit(_post, url, f"Seventh Seal question {i}") for i in range(12)]
        _wait_until(lambda: backend.batcher.queue_depth >= 4)  # 4 of 4: past ready_queue_fraction (0.9)
        batches = backend.batcher.batches
        answers = []
        while not any(a.json()["detail"].startswith("busy: ") for a in answers):
            answers.append(httpx.get(url + "/ready", timeout=5))
            assert len(answers) < 50, "never saw the saturated queue"
        assert {a.status_code for a in answers} == {200}, answers[-1].text  # was 503: SkyServe dropped it
        assert answers[-1].json() == {
            "ready": True,
            "detail": "busy: test queue is saturated (4 of 4 queries waiting); /retrieve sheds with 503 when full",
        }
        statuses = [c.result().status_code for c in calls]
        assert backend.batcher.batches > batches  # it kept working while it said so
        shed = [c.result() for c in calls if c.result().status_code == 503]
        assert shed and set(statuses) == {200, 503}, statuses  # shed at the replica, the rest answered
        assert all(int(r.headers["Retry-After"]) >= 1 and "queue is full" in r.json()["detail"] for r in shed)
        assert httpx.get(url + "/ready", timeout=5).json() == {"ready": True, "detail": "ok"}


def test_a_stalled_worker_still_fails_ready() -> None:
    fn = HashedFlatSearch(TINY_CORPUS)
    fn.gate.clear()  # the worker hangs inside its first batch
    backend = BatchedBackend(fn, queue_size=4, batch_size=1, batch_wait_ms=0, cache_size=0)
    backend.batcher.stall_s = 0.3
    with serve_in_thread(create_app(SETTINGS, backend=backend)) as url, ThreadPoolExecutor(2) as pool:
        call = pool.submit(_post, url, "hangs")
        _wait_until(lambda: backend.batcher.in_flight == 1 and backend.batcher.queue_depth == 0)
        time.sleep(0.4)
        ready = httpx.get(url + "/ready", timeout=5)
        assert ready.status_code == 503 and "worker stalled" in ready.json()["detail"]
        fn.gate.set()
        assert call.result().status_code == 200


def test_a_fault_is_not_hidden_by_load_in_another_part() -> None:
    """Hybrid: the dense part's worker is stalled while the bm25 part's queue is saturated. /ready must fail on
    the fault; it used to find "queue is saturated" in the joined text and answer 200 "busy", keeping a replica
    whose dense half was stuck in the load balancer."""
    stuck, slow = HashedFlatSearch(TINY_CORPUS), HashedFlatSearch(TINY_CORPUS, delay_s=3.0)
    stuck.gate.clear()  # the dense worker hangs inside its first batch
    dense = BatchedBackend(stuck, queue_size=64, batch_size=1, batch_wait_ms=0, cache_size=0)
    bm25 = BatchedBackend(slow, queue_size=4, batch_size=1, batch_wait_ms=0, cache_size=0)
    dense.batcher.stall_s = 0.3
    hybrid = HybridBackend(dense, bm25)
    settings = SETTINGS.model_copy(
        update={"warm_up": False}
    )  # the warm-up query would wait on the stuck part
    with serve_in_thread(create_app(settings, backend=hybrid)) as url, ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(_post, url, f"Seventh Seal question {i}") for i in range(8)]
        _wait_until(lambda: dense.problem() is not None and bm25.busy() is not None)
        ready = httpx.get(url + "/ready", timeout=5)
        assert ready.status_code == 503, ready.text
        assert ready.json()["detail"].startswith("test worker stalled: one batch has run for ")
        assert "saturated" not in ready.json()["detail"]
        assert bm25.busy() is not None  # still saturated when /ready answered
        stuck.gate.set()
        slow.delay_s = 0.0
        assert {c.result().status_code for c in calls} <= {200, 503}


class ColdFlat(HashedFlatSearch):
    """A Flat search whose first call pages in the whole index (seconds here; ~516 s for wiki-18 on a replica)."""

    cold_s = 1.2

    def __call__(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        if not self.calls:
            time.sleep(self.cold_s)
        return super().__call__(queries, topk)


class ColdDense(BatchedBackend):
    name = "dense"  # an indexed backend: the app warms it up


@pytest.mark.parametrize("warm_up", [True, False], ids=["warm-up", "no-warm-up"])
def test_a_cold_index_is_warmed_before_the_replica_reports_ready(warm_up: bool) -> None:
    fn = ColdFlat(TINY_CORPUS)
    backend = ColdDense(fn, batch_size=4, batch_wait_ms=0, cache_size=0)
    backend.batcher.stall_s = 0.5  # worker_stall_s, scaled down with the cold read
    settings = SETTINGS.model_copy(update={"warm_up": warm_up})
    with serve_in_thread(create_app(settings, backend=backend), ready_path="/ready") as url:
        # the first 200 on /ready came after the warm-up query went through the index (and only then)
        assert [q for q, _ in fn.calls] == ([[WARM_UP_QUERY]] if warm_up else [])
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(_post, url, "Who directed The Seventh Seal?")
            time.sleep(0.8)
            during = httpx.get(url + "/ready", timeout=5)
            assert first.result().status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=5).text
    if warm_up:
        assert during.status_code == 200  # the first real batch is a warm one
        assert "searchrl_retrieval_queries_total 1.0" in metrics  # the warm-up is not a client's query
    else:  # the old behaviour: the first real batch pays the cold read and looks stalled
        assert during.status_code == 503 and "worker stalled" in during.json()["detail"]
