"""RetrievalClient: the only code that calls the retrieval service (used by the verl tool, the agent loop, eval,
the launch's corpus check and health checks). One HTTP exchange is retrieval/client/transport.py's (aiohttp); this
module decides where each attempt goes and whether to try again.

Failure policy, built so one bad replica never stalls a training run:
- **Spread:** each attempt orders the URLs by fewest outstanding requests, ties broken round-robin, so load
  spreads over replicas and a hung replica (requests pile up on it) stops getting new ones.
- **Circuit breaker per URL** (`CircuitBreaker`): a refused connection opens it at once, `breaker_failures`
  consecutive timeouts/5xx open it too. An open URL is skipped (a dead replica costs one fast failure, not a
  timeout per call), and after `breaker_reset_s` (doubling up to `breaker_max_reset_s`) one probe request is let
  through (half-open); success closes it. 429 and 503 are load signals, not faults: they never open it. With a
  single URL (e.g. SkyServe's load balancer) the breaker is off: there is no other replica to send the call to.
- **Hedging** (issue 26): retrieval is read-only, so a duplicate request is safe. If an attempt has no answer
  after the hedge delay (the recent p95 attempt latency, kept within [`hedge_min_s`, `hedge_max_s`]), a second
  request goes to the next URL the breaker allows (with one URL: the same URL on another connection, which helps
  against a wedged connection, not a wedged server); the first answer wins and the other is cancelled. A token
  bucket caps hedges at `hedge_budget` (10%) extra requests, with a burst of 10. A primary outrun by its hedge
  counts as a fault against its URL's breaker, and when a breaker opens, every call still waiting on that URL
  hedges at once, outside the budget (so does a half-open probe): a frozen replica (SIGSTOP) costs its in-flight
  calls about one hedge delay, not `timeout_s`. A half-open probe outrun by its hedge is not cancelled: the call
  takes the hedge's answer and the probe runs on to its own end (within `timeout_s`), whose answer closes the
  breaker or reopens it. Counting the outrun instead reopened a restarted replica's breaker at each of its first,
  slower answers, the cool-down doubling to 30 s each time (the SIGKILL bench, tests/bench/test_reliability.py).
  `hedge_budget=0` turns hedging off.
- **Deadlines:** `connect_timeout_s` for the TCP connect, `timeout_s` per attempt (reading the answer), waiting
  for one of our own `max_connections` slots is bounded separately by `pool_timeout_s` (kind "pool"), and the
  whole call, retries included, by `deadline_s`.
- **Retries (searchrl/http.py `retrying`, on tenacity):** only retryable failures (connect, timeout, pool, 429, 5xx) are retried,
  after a jittered exponential back-off or the server's Retry-After if longer; a wait that would end past the
  deadline is not started. Other 4xx (bad request, wrong token) and malformed answers are not retried: repeating them cannot help.

Every failure surfaces as `RetrievalUnavailableError` with a short `kind` ("timeout", "connect", "pool",
"http_401", "http_503", "malformed") for metrics; messages never contain the API key. `stats()` returns per-URL
counters (sent, ok, failed by kind, breaker state) that the verl tool and eval report.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, RetrievalUnavailableError, RetryableError, RetryableRetrievalError
from searchrl.http import AsyncClosing, retrying, tls_context
from searchrl.retrieval.client.breaker import CircuitBreaker, UrlStats
from searchrl.retrieval.client.hedging import HedgeBudget
from searchrl.retrieval.client.hits import Hit
from searchrl.retrieval.client.transport import Transport
from searchrl.urls import scheme_problem, split_urls

log = logging.getLogger(__name__)


# The client's defaults, declared once: trainer/settings.py (RETRIEVAL_* knobs) and trainer/toolconfig.py (the
# tool YAML verl loads) take theirs from here, so the three can no longer drift apart.
TIMEOUT_S = 10.0  # one attempt, reading the answer
CONNECT_TIMEOUT_S = 2.0  # TCP connect: a dead replica fails fast
POOL_TIMEOUT_S = 5.0  # waiting for a connection slot: load, not a fault
MAX_RETRIES = 3  # retries after the first try, over all URLs
BACKOFF_BASE_S = 0.2
BACKOFF_MAX_S = 5.0


class RetrievalClient(AsyncClosing):
    """Async client for one or more replicas of the retrieval service.

    Construction does no I/O (verl builds tools in processes that never call them); the aiohttp session is
    created on first use in the running event loop, and re-created if the loop changes.

    `timeout_s` bounds one attempt (reading the answer); `deadline_s` (default: `timeout_s` x attempts) bounds a
    whole `search()` call, retries and Retry-After waits included.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        api_key: str | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
        max_retries: int = MAX_RETRIES,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        max_connections: int = 256,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        deadline_s: float | None = None,
        breaker_failures: int = 3,
        breaker_reset_s: float = 1.0,
        breaker_max_reset_s: float = 30.0,
        hedge_budget: float = 0.1,
        hedge_quantile: float = 0.95,
        hedge_min_s: float = 0.05,
        hedge_max_s: float = 1.0,
        ca_bundle: str | Path | None = None,
    ) -> None:
        url_list = split_urls(urls)
        if not url_list:
            raise ConfigError(
                "no retrieval URL given: set RETRIEVAL_SERVICE_URL (e.g. http://127.0.0.1:8000)"
            )
        for u in url_list:
            if problem := scheme_problem(u):
                raise ConfigError(problem)
        self.urls = [u if u.endswith("/retrieve") else u + "/retrieve" for u in url_list]
        # https:// URLs trust the system's CAs plus `ca_bundle` (default: $SEARCHRL_RETRIEVAL_CA_BUNDLE)
        https = any(u.startswith("https://") for u in self.urls)
        tls = tls_context(ca_bundle) if https else None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_connections = max_connections
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.pool_timeout_s = pool_timeout_s
        self.deadline_s = deadline_s if deadline_s is not None else timeout_s * (max_retries + 1)
        # With one URL there is nowhere else to go: skipping it would only fail calls without trying, so the
        # breaker is off and retries with back-off pace the calls instead.
        failures = breaker_failures if len(self.urls) > 1 else 0
        self.breakers = {
            u: CircuitBreaker(failures=failures, reset_s=breaker_reset_s, max_reset_s=breaker_max_reset_s)
            for u in self.urls
        }
        self._stats = {u: UrlStats() for u in self.urls}
        self._rr = 0
        self.calls = 0  # search() calls
        self.retries = 0  # attempts after the first, over all calls
        self.hedge_budget = hedge_budget  # extra requests per call, as a fraction; 0 = no hedging
        self._hedging = HedgeBudget(hedge_budget, hedge_quantile, hedge_min_s, hedge_max_s)
        self.hedges = 0  # duplicate requests sent (budgeted, probes and breaker failovers)
        self.hedges_won = 0  # ... that answered first
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}  # URL -> calls to wake if its breaker opens
        # half-open probes left to finish after their call took a hedge's answer (`_probe_ended`)
        self._probes: set[asyncio.Task[list[list[Hit]]]] = set()
        self._transport = Transport(
            api_key=api_key or None,
            tls=tls,
            timeout_s=timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            pool_timeout_s=pool_timeout_s,
            max_connections=max_connections,
        )

    # --- counters --------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since construction: per URL (sent, ok, failed by kind, outstanding, breaker state) and
        totals. Plain dicts, so the verl tool and eval can log or serialise them as they are."""
        per_url = {}
        for url in self.urls:
            st, br = self._stats[url], self.breakers[url]
            per_url[url.removesuffix("/retrieve")] = {
                "sent": st.sent,
                "ok": st.ok,
                "failed": dict(st.failed),
                "outstanding": st.outstanding,
                "outrun": st.outrun,
                "breaker": br.state,
                "breaker_opened": br.opened,
                "last_error": st.last_error,
            }
        return {
            "calls": self.calls,
            "retries": self.retries,
            "hedges": self.hedges,
            "hedges_won": self.hedges_won,
            "hedges_denied": self._hedging.denied,
            "hedge_delay_s": round(self._hedging.delay_s, 4),
            "urls": per_url,
        }

    def _record_failure(self, url: str, exc: RetrievalUnavailableError) -> None:
        st = self._stats[url]
        st.failed[exc.kind] = st.failed.get(exc.kind, 0) + 1
        st.last_error = str(exc)[:200]
        breaker = self.breakers[url]
        if exc.kind in {"http_429", "http_503", "pool"}:
            breaker.release_probe()  # load, not a fault
        elif isinstance(exc, RetryableError) and breaker.record_failure(exc.kind):
            self._opened(url, exc.kind)

    def _record_outrun(self, url: str) -> None:
        """A hedge sent later answered first: the URL is slow or hung, a fault for its breaker; but a half-open
        probe's verdict is its own answer (`_probe_ended`), not this race."""
        self._stats[url].outrun += 1
        if self.breakers[url].state != "half_open" and self.breakers[url].record_failure("outrun"):
            self._opened(url, "its hedges answered first")

    def _probe_ended(self, url: str, task: asyncio.Task[list[list[Hit]]]) -> None:
        """Done-callback of a half-open probe the call no longer waits for: its answer is the breaker's verdict."""
        self._probes.discard(task)
        breaker = self.breakers[url]
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or not isinstance(exc, RetrievalUnavailableError | None):
            breaker.release_probe()  # no verdict (the client closed, or an error that is not the URL's)
        elif exc is None:
            self._stats[url].ok += 1
            breaker.record_success()
        else:
            self._record_failure(url, exc)
            if not isinstance(exc, RetryableRetrievalError):
                breaker.release_probe()

    def _opened(self, url: str, why: str) -> None:
        log.warning(
            "retrieval circuit breaker OPEN for %s for %.1fs after %s",
            url,
            self.breakers[url].seconds_to_probe(),
            why,
        )
        # calls still waiting on it hedge now instead of waiting out their hedge delay or timeout_s
        for waiter in self._waiters.pop(url, set()):
            if not waiter.done():
                waiter.set_result(None)

    # --- hedging ---------------------------------------------------------------------------------------
    def _unwait(self, wake: asyncio.Future[None]) -> None:
        for waiters in self._waiters.values():
            waiters.discard(wake)

    # --- requests --------------------------------------------------------------------------------------
    def _order(self) -> list[str]:
        """URLs by fewest outstanding requests, ties round-robin (so calls spread over replicas)."""
        n = len(self.urls)
        start = self._rr % n
        self._rr += 1
        return sorted(
            self.urls,
            key=lambda u: (self._stats[u].outstanding, (self.urls.index(u) - start) % n),
        )

    def _launch(
        self,
        urls: Iterator[str],
        racing: dict[asyncio.Task[list[list[Hit]]], str],
        body: dict[str, Any],
        n_queries: int,
        deadline: float,
    ) -> asyncio.Task[list[list[Hit]]] | None:
        """Start a request to the next of `urls` whose breaker allows it; None when none is left."""
        for url in urls:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not self.breakers[url].allow():
                continue
            task = asyncio.ensure_future(
                self._transport.post(url, body, n_queries, min(self.timeout_s, remaining), self._stats[url])
            )
            racing[task] = url
            return task
        return None

    async def _attempt(self, body: dict[str, Any], n_queries: int, deadline: float) -> list[list[Hit]]:
        """One attempt: a request to the best URL the breakers allow, a hedge after the hedge delay (or at
        once if the URL's breaker opens meanwhile), failover to the next URL on a retryable failure; returns
        the first answer and cancels the other request."""
        loop = asyncio.get_running_loop()
        order = iter(self._order())
        racing: dict[asyncio.Task[list[list[Hit]]], str] = {}
        started: dict[asyncio.Task[list[list[Hit]]], float] = {}
        last: RetryableRetrievalError | None = None
        primary: asyncio.Task[list[list[Hit]]] | None = None
        wake: asyncio.Future[None] = loop.create_future()
        may_hedge = False  # no hedge sent yet for this primary
        hedge_at: float | None = None  # when the budgeted hedge is due; None: no timer (sent or denied)
        try:
            while True:
                if not racing:
                    primary = self._launch(order, racing, body, n_queries, deadline)
                    if primary is None:
                        break
                    started[primary] = time.monotonic()
                    self._unwait(wake)
                    wake = loop.create_future()
                    self._waiters.setdefault(racing[primary], set()).add(wake)
                    may_hedge = self.hedge_budget > 0
                    hedge_at = started[primary] + self._hedging.delay_s if may_hedge else None
                timeout = None if hedge_at is None else max(0.0, hedge_at - time.monotonic())
                waits: set[asyncio.Future[Any]] = set(racing)
                if may_hedge:
                    waits.add(wake)
                done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if may_hedge and primary in racing and not done - {wake}:
                    # no answer yet, and the hedge delay passed or the primary's breaker opened.
                    # Outside the budget: the breaker opened under us, or the primary is a half-open probe.
                    free = wake.done() or self.breakers[racing[primary]].state != "closed"
                    hedge_at = None  # denied: only the breaker opening can still send one
                    if free or self._hedging.take():
                        may_hedge = False  # one hedge per primary
                        # with one URL, the same URL on another connection (a wedged connection is cured)
                        more = order if len(self.urls) > 1 else iter(self.urls)
                        hedge = self._launch(more, racing, body, n_queries, deadline)
                        if hedge is not None:
                            started[hedge] = time.monotonic()
                            self.hedges += 1
                        elif not free:
                            self._hedging.give_back()  # nowhere to send it: the token is not spent
                for task in done:
                    if task is wake:
                        continue
                    url = racing.pop(task)  # type: ignore[call-overload]  # asyncio.wait hands back our Tasks as Futures
                    exc = task.exception()
                    if exc is None:
                        self._stats[url].ok += 1
                        self.breakers[url].record_success()
                        self._hedging.note_latency(time.monotonic() - started[task])  # type: ignore[index]
                        if task is not primary:
                            self.hedges_won += 1
                            if primary in racing:
                                self._record_outrun(racing[primary])
                        hits: list[list[Hit]] = task.result()
                        return hits
                    if not isinstance(exc, RetrievalUnavailableError):
                        raise exc
                    log.debug("retrieval attempt failed: %s", exc)
                    self._record_failure(url, exc)
                    if not isinstance(exc, RetryableRetrievalError):
                        self.breakers[url].release_probe()
                        raise exc
                    last = exc
        finally:
            for task, url in racing.items():
                if self.breakers[url].state == "half_open" and not task.done():
                    # the probe runs on: its own answer, not the race it lost, closes or reopens the breaker
                    self._probes.add(task)
                    task.add_done_callback(functools.partial(self._probe_ended, url))
                    continue
                task.cancel()
                task.add_done_callback(_consume)
                if self.breakers[url].state == "half_open":
                    self.breakers[url].release_probe()  # a cancelled probe has no verdict
            self._unwait(wake)
        if last is not None:
            raise last
        # every breaker is open: wait until the first one lets a probe through (within the deadline)
        wait = min(b.seconds_to_probe() for b in self.breakers.values())
        errors = "; ".join(s.last_error for s in self._stats.values() if s.last_error)[:300]
        kinds = [k for s in self._stats.values() for k in s.failed]
        raise RetryableRetrievalError(
            f"all {len(self.urls)} retrieval URL(s) are failing (circuit breakers open): {errors or 'deadline'}",
            kind=kinds[-1] if kinds else "timeout",
            retry_after=wait,
        )

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Top-`topk` hits per query, in query order; raises RetrievalUnavailableError when all tries fail."""
        queries = list(queries)
        if not queries:
            return []
        body = {"queries": queries, "topk": int(topk), "return_scores": True}
        self.calls += 1
        self._hedging.refill()
        started = time.monotonic()
        deadline = started + self.deadline_s
        attempts = 0
        try:
            async for attempt in retrying(
                attempts=self.max_retries + 1,
                base_s=self.backoff_base_s,
                max_s=self.backoff_max_s,
                jitter=1.0,  # full jitter, as tenacity's wait_random_exponential
                retry_after_max_s=60.0,
                deadline_s=self.deadline_s,  # never start a wait (back-off or Retry-After) past the deadline
            ):
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        self.retries += 1
                    return await self._attempt(body, len(queries), deadline)
        except RetryableRetrievalError as exc:
            # Re-raise as the plain type: callers tell "retried and failed" by the attempts in the message.
            raise RetrievalUnavailableError(
                f"{exc} (after {attempts} attempts over {len(self.urls)} URL(s) in "
                f"{time.monotonic() - started:.1f}s)",
                kind=exc.kind,
                status=exc.status,
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def info(self) -> dict[str, Any]:
        """What the service says about itself (`GET /`: backend, corpus, index and their checksums), from the
        first URL that answers, with that URL under "url"; over the same TLS trust and token as `search`.

        401/403 raise at once (the token is wrong everywhere); other failures try the next URL. A body that is
        not a JSON object reads as {"url": url} (and "raw" for other JSON).
        """
        problems = []
        for url in (u.removesuffix("/retrieve") for u in self.urls):
            try:
                info = await self._transport.get(url + "/")
            except RetrievalUnavailableError as exc:
                if exc.status in (401, 403):
                    raise RetrievalUnavailableError(
                        f"retrieval service {url} answered HTTP {exc.status}: set RETRIEVAL_API_KEY to its token",
                        kind=exc.kind,
                        status=exc.status,
                    ) from None
                if exc.kind == "tls":
                    raise
                problems.append(f"{url}: {exc.kind}")
                continue
            if info is None:
                log.warning("GET %s/ is not JSON; the protocol will not name the backend", url)
                return {"url": url}
            return {**info, "url": url} if isinstance(info, dict) else {"url": url, "raw": info}
        raise RetrievalUnavailableError(
            f"no retrieval service answered ({'; '.join(problems)}); start one with `searchrl serve` "
            "or set --retrieval-url / RETRIEVAL_SERVICE_URL",
            kind="connect",
        )

    async def aclose(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        if self._probes:
            await asyncio.wait(self._probes)
        await self._transport.aclose()


def _consume(task: asyncio.Task[Any]) -> None:
    """Done-callback of a cancelled loser: fetch its outcome so asyncio never logs it as unretrieved."""
    if not task.cancelled():
        task.exception()


__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_MAX_S",
    "CONNECT_TIMEOUT_S",
    "MAX_RETRIES",
    "POOL_TIMEOUT_S",
    "TIMEOUT_S",
    "RetrievalClient",
]
