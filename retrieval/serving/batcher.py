"""Cross-request micro-batching with a result cache, in-flight de-duplication and backpressure.

Why: under RL rollouts the service gets hundreds of concurrent one-query requests, and an encoder forward
pass costs about the same for 1 query as for 64 (DESIGN.md section 5). So requests only *enqueue* their
queries; one worker thread per encoder/index (the only thread that touches the model and the FAISS index,
which matters because FAISS GPU indexes are not thread-safe even for reads) drains the queue into batches of
at most `batch_size` queries, calls the synchronous batch function once, and hands each request its results
through `loop.call_soon_threadsafe`. The event loop never blocks on model work.

Adaptive wait (issue 24): the worker waits up to `batch_wait_ms` for a batch to fill only while there is
concurrency to wait for. Its target is the largest batch among the last few (`_RECENT_BATCHES`): a lone
client (an agent at evaluation time, a developer with curl, the first query of an RL burst) has batches of 1,
so its query goes to the encoder at once, with no wait at all; 32 clients have batches of ~32, so the worker
waits until ~32 queries are queued (or the wait runs out), which also ends the wait early instead of always
sleeping the whole `batch_wait_ms` when fewer than `batch_size` clients exist.

In front of the queue:
- a normalised-query LRU result cache (GRPO's n=5..16 samples per prompt repeat the same queries), and
- in-flight de-duplication: an identical (query, topk) already queued or being computed gets the same result.

Behind it, backpressure: at most `queue_size` queries wait; past that `OverloadedError` (HTTP 503 with
Retry-After) instead of unbounded latency, and each request has a deadline (`request_timeout_s`). Retry-After
is the time the queue needs to drain at the measured rate, capped at `retry_after_max_s` so it stays inside a
client's deadline (a 30 s Retry-After is useless to a client that gives up after 10 s).

Idle hook: `on_idle(settled)` runs on the worker thread when a batch leaves the queue empty (settled=False)
and once more when the queue has stayed empty for `idle_s` after a batch (settled=True); the dense backend
gives freed heap memory back to the OS there (retrieval/heap.py, issue 24).

Watchdog: `problem()` says why the batcher cannot serve (worker thread dead, one batch running longer than
`stall_s`, queue nearly full); the app's `/ready` reports it so the load balancer stops sending traffic.

`close()` stops taking new requests, lets everything queued finish, then stops the worker; uvicorn's
graceful shutdown (SIGTERM) waits for in-flight HTTP requests before the lifespan calls it.

No FastAPI (or Prometheus) imports here: the app attaches a metrics sink with `attach_metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from searchrl.errors import BackendError, OverloadedError, SearchRLError
from searchrl.retrieval.schemas import ScoredDocument

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

#: How many of the latest batch sizes set the adaptive wait's target (the largest of them). Long enough to
#: ride over one batch that the wait cut short, short enough (a few hundred ms) to stop waiting soon after
#: concurrency ends.
_RECENT_BATCHES = 16

Hits = list[ScoredDocument]
#: fn(queries, topk) -> one list of hits per query, best first; runs on the worker thread only.
BatchFn = Callable[[list[str], int], list[Hits]]


class BatcherMetrics(Protocol):
    """Where the batcher reports what it does; `searchrl.retrieval.serving.metrics.RetrievalMetrics` implements it."""

    def observe_batch(self, size: int, seconds: float) -> None: ...
    def observe_queue_wait(self, seconds: Sequence[float]) -> None: ...
    def set_queue_depth(self, depth: int) -> None: ...
    def count_cache(self, hits: int, misses: int) -> None: ...
    def count_dedup(self, n: int) -> None: ...


class _NoMetrics:
    def observe_batch(self, size: int, seconds: float) -> None:
        pass

    def observe_queue_wait(self, seconds: Sequence[float]) -> None:
        pass

    def set_queue_depth(self, depth: int) -> None:
        pass

    def count_cache(self, hits: int, misses: int) -> None:
        pass

    def count_dedup(self, n: int) -> None:
        pass


def normalize_query(query: str) -> str:
    """The cache and de-duplication key, and the text actually encoded.

    Only whitespace is collapsed: case and punctuation can change what a cased encoder returns, and encoding
    the normalised text means a cached answer is exactly what a fresh computation would give.
    """
    return " ".join(query.split())


@dataclass(eq=False)
class _Item:
    """One unique (normalised query, topk) waiting in the queue or being computed."""

    query: str
    topk: int
    enqueued_at: float
    deadline: float  # the latest deadline among its waiters; the worker skips items nobody waits for
    future: asyncio.Future[Hits] = field(repr=False)


class _LRU:
    """Normalised query -> (topk it was computed with, hits). Touched on the event-loop thread only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[str, tuple[int, Hits]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, query: str, topk: int) -> Hits | None:
        entry = self._data.get(query)
        if entry is None:
            return None
        k, hits = entry
        # A result computed with a larger k serves any smaller k; one that came back short (fewer passages
        # than k exist) is complete for every k.
        if k < topk and len(hits) >= k:
            return None
        self._data.move_to_end(query)
        return hits[:topk]

    def put(self, query: str, topk: int, hits: Hits) -> None:
        if self.capacity <= 0:
            return
        old = self._data.get(query)
        if old is not None and old[0] > topk:
            self._data.move_to_end(query)
            return
        self._data[query] = (topk, hits)
        self._data.move_to_end(query)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)


class Batcher:
    """Batch queries from concurrent requests into single calls of a synchronous `fn(queries, topk)`.

    Construct anywhere; `start()` must be awaited on the event loop that will call `search()`.
    """

    def __init__(
        self,
        fn: BatchFn,
        *,
        batch_size: int = 64,
        batch_wait_ms: float = 2.0,
        queue_size: int = 4096,
        cache_size: int = 100_000,
        request_timeout_s: float = 30.0,
        name: str = "batcher",
        executor: Executor | None = None,
        retry_after_max_s: float = 30.0,
        stall_s: float = 30.0,
        ready_queue_fraction: float = 0.9,
        on_idle: Callable[[bool], object] | None = None,
        idle_s: float = 1.0,
    ) -> None:
        """`executor`: run the worker loop there (a single-thread executor that already owns the model and
        index, e.g. the one that loaded a GPU index) instead of on a thread of its own. `on_idle`: see the
        module docstring."""
        if batch_size < 1 or queue_size < 1:
            raise ValueError("batch_size and queue_size must be at least 1")
        self.fn = fn
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.queue_size = queue_size
        self.request_timeout_s = request_timeout_s
        self.retry_after_max_s = retry_after_max_s
        self.stall_s = stall_s
        self.ready_queue_fraction = ready_queue_fraction
        self._busy_since: float | None = None  # monotonic start of the batch the worker is computing
        self._worker_error: BaseException | None = None
        self.name = name
        self.metrics: BatcherMetrics = _NoMetrics()
        self._cache = _LRU(cache_size)
        self._inflight: dict[tuple[str, int], _Item] = {}
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._stopping = False  # worker: exit once the queue is empty
        self._closing = False  # search(): refuse new work
        self._thread: threading.Thread | None = None
        self._executor = executor
        self._worker: Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # queries/s of the worker, smoothed; used to tell overloaded clients how long to back off
        self._rate = 0.0
        # unique queries in each of the latest batches: the adaptive wait's evidence of concurrency
        self._recent: deque[int] = deque([1], maxlen=_RECENT_BATCHES)
        self._on_idle = on_idle
        self.idle_s = idle_s
        self._since_settled = 0  # batches since on_idle(settled=True) last ran
        self._target = 1  # wait_target, kept by the worker thread (one int: read without the lock)
        self.batches = 0  # batches computed (tests and logs)
        self.submitted = 0  # unique queries accepted into the queue

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def from_settings(
        cls,
        fn: BatchFn,
        settings: RetrievalSettings,
        *,
        name: str,
        executor: Executor | None = None,
        on_idle: Callable[[bool], object] | None = None,
    ) -> Batcher:
        """The service's batcher for one backend: every limit comes from the retrieval settings."""
        return cls(
            fn,
            batch_size=settings.batch_size,
            batch_wait_ms=settings.batch_wait_ms,
            queue_size=settings.queue_size,
            cache_size=settings.cache_size,
            request_timeout_s=settings.request_timeout_s,
            name=name,
            executor=executor,
            retry_after_max_s=settings.retry_after_max_s,
            stall_s=settings.worker_stall_s,
            ready_queue_fraction=settings.ready_queue_fraction,
            on_idle=on_idle,
        )

    async def start(self) -> None:
        if self._thread is not None or self._worker is not None:
            return
        self._loop = asyncio.get_running_loop()
        if self._executor is not None:
            self._worker = self._executor.submit(self._run)
        else:
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-worker", daemon=True)
            self._thread.start()
        log.info(
            "%s: batching up to %d queries, waiting up to %.1f ms; queue bound %d; cache %d entries",
            self.name,
            self.batch_size,
            self.batch_wait_s * 1000,
            self.queue_size,
            self._cache.capacity,
        )

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new requests, finish every queued one, then stop the worker thread."""
        self._closing = True
        pending = [item.future for item in self._inflight.values()]
        if pending:
            log.info("%s: draining %d in-flight queries before shutdown", self.name, len(pending))
            await asyncio.wait(pending, timeout=timeout_s or self.request_timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout_s or self.request_timeout_s)
            self._thread = None
        if self._worker is not None:
            await asyncio.wait(
                [asyncio.wrap_future(self._worker)], timeout=timeout_s or self.request_timeout_s
            )
            self._worker = None

    def attach_metrics(self, metrics: BatcherMetrics) -> None:
        self.metrics = metrics

    def problem(self) -> str | None:
        """Why this batcher cannot take traffic now (a fault: /ready fails), or None when it can. A full queue
        is not a fault: see `busy`."""
        if self._loop is None:
            return f"{self.name} is not started"
        if self._closing:
            return f"{self.name} is draining for shutdown"
        dead = (self._thread is not None and not self._thread.is_alive()) or (
            self._worker is not None and self._worker.done()
        )
        if dead:
            why = f": {type(self._worker_error).__name__}: {self._worker_error}" if self._worker_error else ""
            return f"{self.name} worker thread is dead{why}"
        busy_since = self._busy_since
        if busy_since is not None and time.monotonic() - busy_since > self.stall_s:
            return f"{self.name} worker stalled: one batch has run for {time.monotonic() - busy_since:.0f}s"
        return None

    def busy(self) -> str | None:
        """Load, not a fault: the queue is past `ready_queue_fraction` full (None otherwise). /ready stays 200
        and says so; /retrieve sheds with 503 + Retry-After once the queue is full."""
        if len(self._queue) >= self.ready_queue_fraction * self.queue_size:
            return f"{self.name} queue is saturated ({len(self._queue)} of {self.queue_size} queries waiting)"
        return None

    @property
    def queue_depth(self) -> int:
        """Queries waiting for the worker (not counting the batch it is computing)."""
        return len(self._queue)

    @property
    def wait_target(self) -> int:
        """Queued queries at which the worker stops waiting for more: the largest recent batch, within
        [1, batch_size]. 1 means no concurrency was seen lately, so a query is dispatched as soon as it comes."""
        return self._target

    @property
    def in_flight(self) -> int:
        """Unique queries queued or being computed."""
        return len(self._inflight)

    # --- request side (event-loop thread) ----------------------------------------------------------------
    async def search(self, queries: list[str], topk: int) -> list[Hits]:
        """Hits for each query, in order; from the cache, an identical in-flight query, or a new batch."""
        if self._closing:
            raise OverloadedError(
                "the retrieval service is shutting down; retry on another replica", retry_after=1
            )
        if self._loop is None:
            raise BackendError(f"{self.name} is not started")
        now = time.monotonic()
        deadline = now + self.request_timeout_s
        results: list[Hits | None] = [None] * len(queries)
        waiting: list[tuple[int, asyncio.Future[Hits]]] = []
        new_items: list[_Item] = []
        hits = misses = dedup = 0
        for i, raw in enumerate(queries):
            q = normalize_query(raw)
            cached = self._cache.get(q, topk)
            if cached is not None:
                results[i] = cached
                hits += 1
                continue
            misses += 1
            key = (q, topk)
            item = self._inflight.get(key)
            if item is None:
                item = _Item(q, topk, now, deadline, self._loop.create_future())
                self._inflight[key] = item
                new_items.append(item)
            else:
                dedup += 1
                item.deadline = max(item.deadline, deadline)
            waiting.append((i, item.future))
        self.metrics.count_cache(hits, misses)
        if dedup:
            self.metrics.count_dedup(dedup)
        if new_items:
            self._enqueue(new_items)
        if waiting:
            futures = {f for _, f in waiting}
            # asyncio.wait never cancels the futures: other requests may share them.
            _, not_done = await asyncio.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
            if not_done:
                raise OverloadedError(
                    f"request deadline of {self.request_timeout_s:g}s passed with {len(not_done)} "
                    f"queries still queued; retry later or raise SEARCHRL_RETRIEVAL_REQUEST_TIMEOUT_S",
                    retry_after=self._retry_after(),
                )
            for i, f in waiting:
                results[i] = f.result()  # re-raises the batch's error, if any
        return [r if r is not None else [] for r in results]

    def _enqueue(self, items: list[_Item]) -> None:
        with self._cond:
            if len(self._queue) + len(items) > self.queue_size:
                depth = len(self._queue)
                overflow = True
            else:
                was_empty = not self._queue
                self._queue.extend(items)
                depth = len(self._queue)
                overflow = False
                self.submitted += len(items)
                # Wake the worker only when it may be idle or the batch it waits for is ready: every notify
                # costs a thread switch under the GIL.
                if was_empty or depth >= self._target:
                    self._cond.notify()
        self.metrics.set_queue_depth(depth)
        if overflow:
            for item in items:
                self._inflight.pop((item.query, item.topk), None)
                item.future.cancel()
            raise OverloadedError(
                f"retrieval queue is full ({depth} queries waiting, bound {self.queue_size}); "
                "retry after the Retry-After delay or add replicas",
                retry_after=self._retry_after(depth + len(items)),
            )

    def _retry_after(self, depth: int | None = None) -> float:
        depth = self.queue_depth if depth is None else depth
        if self._rate <= 0:
            return 1.0
        return float(min(self.retry_after_max_s, max(1.0, depth / self._rate)))

    # --- worker side (worker thread) ---------------------------------------------------------------------
    def _take_batch(self) -> list[_Item] | None:
        """Block until a batch is ready (or None when stopping with an empty queue)."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                if self._on_idle is None or not self._since_settled:
                    self._cond.wait()
                elif not self._cond.wait(self.idle_s) and not self._queue and not self._stopping:
                    self._since_settled = 0
                    return []  # settled: the caller runs on_idle(True) outside the lock
            # Fill the batch until it holds as many queries as recent batches did (at most batch_size) or its
            # oldest query has waited batch_wait_s. One client: the target is 1, so no wait. Under load the
            # queue filled up while the previous batch ran, so this returns at once.
            target = self.wait_target
            if len(self._queue) < target and self.batch_wait_s > 0:
                until = self._queue[0].enqueued_at + self.batch_wait_s
                while len(self._queue) < target and not self._stopping:
                    remaining = until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            n = min(self.batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        try:
            self._loop_batches()
        except BaseException as exc:  # recorded for problem(): /ready then fails and the replica is replaced
            self._worker_error = exc
            log.exception("%s: worker thread died", self.name)  # logged once here; the thread then ends

    def _idle(self, settled: bool) -> None:
        if self._on_idle is None:
            return
        try:
            self._on_idle(settled)
        except Exception:  # housekeeping must never kill the worker
            log.exception("%s: idle hook failed", self.name)

    def _loop_batches(self) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            if not batch:
                self._idle(settled=True)
                continue
            started = time.monotonic()
            self._busy_since = started
            live = [it for it in batch if it.deadline > started]
            expired = [it for it in batch if it.deadline <= started]
            error: BaseException | None = None
            per_item: list[Hits] = []
            if live:
                # One encode + one search for the unique texts; mixed topk: search with the largest, slice.
                texts = list(dict.fromkeys(it.query for it in live))
                k = max(it.topk for it in live)
                try:
                    out = self.fn(texts, k)
                    if len(out) != len(texts):
                        raise BackendError(
                            f"{self.name}: batch function returned {len(out)} lists for {len(texts)} queries"
                        )
                    by_text = dict(zip(texts, out, strict=True))
                    per_item = [by_text[it.query][: it.topk] for it in live]
                except SearchRLError as exc:
                    error = exc
                except Exception as exc:  # a bug in fn must not kill the worker and hang every request
                    log.exception("%s: batch of %d queries failed", self.name, len(texts))
                    error = BackendError(f"{self.name}: batch failed ({type(exc).__name__}: {exc})")
            elapsed = time.monotonic() - started
            self._busy_since = None
            if live and error is None and elapsed > 0:
                rate = len(live) / elapsed
                self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
            self.batches += 1
            self._recent.append(len(batch))
            self._target = max(1, min(self.batch_size, max(self._recent)))
            waits = [started - it.enqueued_at for it in batch]
            loop.call_soon_threadsafe(self._resolve, live, per_item, expired, error, waits, elapsed)
            self._since_settled += 1
            if not self._queue:
                self._idle(settled=False)

    # --- back on the event-loop thread ---------------------------------------------------------------------
    def _resolve(
        self,
        live: list[_Item],
        per_item: list[Hits],
        expired: list[_Item],
        error: BaseException | None,
        waits: list[float],
        elapsed: float,
    ) -> None:
        self.metrics.observe_batch(len(live), elapsed)
        self.metrics.observe_queue_wait(waits)
        self.metrics.set_queue_depth(len(self._queue))
        for item in expired:
            self._inflight.pop((item.query, item.topk), None)
            if not item.future.done():
                item.future.set_exception(
                    OverloadedError("request deadline passed while queued", retry_after=self._retry_after())
                )
                # nobody may be left to read it; mark it retrieved so asyncio does not log "never retrieved"
                item.future.exception()
        for idx, item in enumerate(live):
            self._inflight.pop((item.query, item.topk), None)
            if item.future.done():
                continue
            if error is not None:
                item.future.set_exception(error)
                item.future.exception()
            else:
                hits = per_item[idx]
                self._cache.put(item.query, item.topk, hits)
                item.future.set_result(hits)


__all__ = ["BatchFn", "Batcher", "BatcherMetrics", "normalize_query"]
