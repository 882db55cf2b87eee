"""RetrievalClient: the only code that calls /retrieve (used by the verl tool, the agent loop and health checks).

Why aiohttp: under RL rollouts a client has 100+ requests in flight; on this class of machine httpx's
AsyncClient tops out near 260 requests/s while aiohttp reaches thousands (../shared/DESIGN.md section 5).

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
  calls about one hedge delay, not `timeout_s`. `hedge_budget=0` turns hedging off.
- **Deadlines:** `connect_timeout_s` for the TCP connect, `timeout_s` per attempt (reading the answer), waiting
  for one of our own `max_connections` slots is bounded separately by `pool_timeout_s` (kind "pool"), and the
  whole call, retries included, by `deadline_s`.
- **Retries (tenacity):** only retryable failures (connect, timeout, pool, 429, 5xx) are retried,
  after a jittered exponential back-off or the server's Retry-After if longer; a wait that would end past the
  deadline is not started. Other 4xx (bad request, wrong token) and malformed answers are not retried: repeating them cannot help.

Every failure surfaces as `RetrievalUnavailableError` with a short `kind` ("timeout", "connect", "pool",
"http_401", "http_503", "malformed") for metrics; messages never contain the API key. `stats()` returns per-URL
counters (sent, ok, failed by kind, breaker state) that the verl tool and eval report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)

from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.prompt import split_title

log = logging.getLogger(__name__)

HEALTH_QUERY = "Who directed The Seventh Seal?"
# A PEM file this machine's clients trust for https:// retrieval URLs, on top of the system's CAs: the
# self-signed certificate of SkyServe's `service.tls` (docs/deploy.md section 7). Read from the environment
# where a client is built because verl builds the search tool in Ray workers on every node, from a YAML; the
# name is also RetrievalSettings.ca_bundle, so the strict settings check knows it.
CA_BUNDLE_ENV = "SEARCHRL_RETRIEVAL_CA_BUNDLE"


def tls_context(ca_bundle: str | Path | None = None) -> ssl.SSLContext | None:
    """The TLS trust for https:// retrieval URLs: the system's CAs plus `ca_bundle` (default: the env var).

    None when neither is set: the library default (system CAs). A missing or unreadable file is a ConfigError
    naming it, not a TLS failure on the first request.
    """
    raw = str(ca_bundle) if ca_bundle is not None else os.environ.get(CA_BUNDLE_ENV, "")
    if not raw.strip():
        return None
    path = Path(raw.strip()).expanduser()
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=str(path))
    except FileNotFoundError:
        raise ConfigError(
            f"{CA_BUNDLE_ENV}={raw.strip()}: no such file (the PEM certificate of the retrieval service's TLS)"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{CA_BUNDLE_ENV}={raw.strip()} is not a readable PEM certificate ({exc})"
        ) from None
    return context


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    contents: str
    score: float
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. "url" from web backends

    @property
    def title(self) -> str:
        return split_title(self.contents)[0]

    @property
    def text(self) -> str:
        return split_title(self.contents)[1]


class _Retryable(RetrievalUnavailableError):
    """Internal: a failure worth another attempt, with the server's Retry-After if it sent one."""

    def __init__(
        self, message: str, *, kind: str, status: int | None = None, retry_after: float | None = None
    ):
        super().__init__(message, kind=kind, status=status)
        self.retry_after = retry_after


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def parse_result(payload: Any, n_queries: int) -> list[list[Hit]]:
    """Validate a `return_scores: true` response and turn it into hits; raise on any shape problem."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        raise RetrievalUnavailableError('response has no "result" list', kind="malformed")
    result = payload["result"]
    if len(result) != n_queries:
        raise RetrievalUnavailableError(
            f"response has {len(result)} result lists for {n_queries} queries", kind="malformed"
        )
    out: list[list[Hit]] = []
    for per_query in result:
        if not isinstance(per_query, list):
            raise RetrievalUnavailableError("a result entry is not a list", kind="malformed")
        hits = []
        for item in per_query:
            try:
                doc = dict(item["document"])
                hits.append(
                    Hit(
                        id=str(doc.pop("id")),
                        contents=str(doc.pop("contents")),
                        score=float(item["score"]),
                        extra=doc,
                    )
                )
            except (KeyError, TypeError, ValueError):
                raise RetrievalUnavailableError(
                    'a result item is not {"document": {"id", "contents"}, "score"}', kind="malformed"
                ) from None
        out.append(hits)
    return out


#: failure kinds that count against a URL's circuit breaker (load signals such as 429/503 do not)
_FAULT_KINDS_INSTANT = frozenset({"connect"})  # the replica is not there: open at once


class CircuitBreaker:
    """Per-URL breaker: closed -> open (skip the URL) -> half-open (one probe) -> closed.

    Not thread-safe: used from one event loop. `clock` is injectable for tests.
    """

    def __init__(
        self,
        *,
        failures: int = 3,
        reset_s: float = 1.0,
        max_reset_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.reset_s = reset_s
        self.max_reset_s = max_reset_s
        self.clock = clock
        self.state = "closed"  # closed | open | half_open
        self.consecutive = 0
        self.opened = 0  # times it opened (counter)
        self._open_until = 0.0
        self._cooldown = reset_s
        self._probe_out = False

    def allow(self) -> bool:
        """May a request go to this URL now? Claims the single probe slot when half-open."""
        if self.state == "closed" or self.failures <= 0:
            return True
        if self.state == "open" and self.clock() >= self._open_until:
            self.state = "half_open"
            self._probe_out = False
        if self.state == "half_open" and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def seconds_to_probe(self) -> float:
        if self.state != "open":
            return 0.0
        return max(0.0, self._open_until - self.clock())

    def record_success(self) -> None:
        if self.state != "closed":
            log.warning("retrieval circuit breaker closed again after a successful probe")
        self.state = "closed"
        self.consecutive = 0
        self._cooldown = self.reset_s
        self._probe_out = False

    def record_failure(self, kind: str) -> bool:
        """Count a fault; returns True when this failure opened the breaker."""
        self.consecutive += 1
        if self.failures <= 0:  # disabled
            return False
        if self.state == "half_open":
            # the probe failed: stay away for longer
            self._cooldown = min(self.max_reset_s, self._cooldown * 2)
            return self._open()
        if self.state == "closed" and (kind in _FAULT_KINDS_INSTANT or self.consecutive >= self.failures):
            return self._open()
        return False

    def release_probe(self) -> None:
        """A probe that ended without a verdict (e.g. 503 overloaded): let another one through."""
        self._probe_out = False

    def _open(self) -> bool:
        self.state = "open"
        self.opened += 1
        self._open_until = self.clock() + self._cooldown
        self._probe_out = False
        return True


#: hedges that may go out at once before the budget (hedge_budget tokens per call) refills
_HEDGE_BURST = 10.0
#: winning latencies seen before the hedge delay follows them (until then it is hedge_max_s)
_HEDGE_MIN_SAMPLES = 20


@dataclass
class UrlStats:
    """Counters for one URL (see `RetrievalClient.stats`)."""

    sent: int = 0
    ok: int = 0
    outrun: int = 0  # attempts cancelled because a hedge on another connection answered first
    failed: dict[str, int] = field(default_factory=dict)  # kind -> count
    outstanding: int = 0
    last_error: str = ""


class RetrievalClient:
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
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        max_connections: int = 256,
        connect_timeout_s: float = 2.0,
        pool_timeout_s: float = 5.0,
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
        url_list = [urls] if isinstance(urls, str) else list(urls)
        url_list = [u.strip().rstrip("/") for u in url_list if u and u.strip()]
        if not url_list:
            raise ConfigError(
                "no retrieval URL given: set RETRIEVAL_SERVICE_URL (e.g. http://127.0.0.1:8000)"
            )
        for u in url_list:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"retrieval URL {u!r} must start with http:// or https://")
        self.urls = [u if u.endswith("/retrieve") else u + "/retrieve" for u in url_list]
        self._api_key = api_key or None
        # https:// URLs trust the system's CAs plus `ca_bundle` (default: $SEARCHRL_RETRIEVAL_CA_BUNDLE)
        https = any(u.startswith("https://") for u in self.urls)
        self._tls: ssl.SSLContext | None = tls_context(ca_bundle) if https else None
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
        if not 0.0 <= hedge_budget <= 1.0 or not 0.0 < hedge_quantile < 1.0 or hedge_min_s > hedge_max_s:
            raise ConfigError(
                f"hedging: need 0 <= hedge_budget <= 1 (got {hedge_budget}), 0 < hedge_quantile < 1 "
                f"(got {hedge_quantile}) and hedge_min_s <= hedge_max_s (got {hedge_min_s}, {hedge_max_s})"
            )
        self.hedge_budget = hedge_budget  # extra requests per call, as a fraction; 0 = no hedging
        self.hedge_quantile = hedge_quantile
        self.hedge_min_s = hedge_min_s
        self.hedge_max_s = hedge_max_s
        self.hedges = 0  # duplicate requests sent (budgeted, probes and breaker failovers)
        self.hedges_won = 0  # ... that answered first
        self.hedges_denied = 0  # hedges not sent: budget spent
        self._hedge_tokens = _HEDGE_BURST
        self._latencies: deque[float] = deque(maxlen=256)  # recent winning attempt latencies
        self._samples = 0
        self._hedge_delay = hedge_max_s  # until enough latencies are seen
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}  # URL -> calls to wake if its breaker opens
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # Our semaphore bounds connections (so pool waiting has its own deadline); the connector does not.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, ssl=self._tls if self._tls is not None else True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.connect_timeout_s, sock_read=self.timeout_s
                ),
            )
            self._slots = asyncio.Semaphore(self.max_connections)
            self._loop = loop
        return self._session

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
            "hedges_denied": self.hedges_denied,
            "hedge_delay_s": round(self._hedge_delay, 4),
            "urls": per_url,
        }

    def _record_failure(self, url: str, exc: RetrievalUnavailableError) -> None:
        st = self._stats[url]
        st.failed[exc.kind] = st.failed.get(exc.kind, 0) + 1
        st.last_error = str(exc)[:200]
        breaker = self.breakers[url]
        if exc.kind in {"http_429", "http_503", "pool"}:
            breaker.release_probe()  # load, not a fault
        elif isinstance(exc, _Retryable) and breaker.record_failure(exc.kind):
            self._opened(url, exc.kind)

    def _record_outrun(self, url: str) -> None:
        """A hedge sent later answered first: the URL is slow or hung, a fault for its breaker."""
        self._stats[url].outrun += 1
        if self.breakers[url].record_failure("outrun"):
            self._opened(url, "its hedges answered first")

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
    def _note_latency(self, seconds: float) -> None:
        self._latencies.append(seconds)
        self._samples += 1
        n = len(self._latencies)
        if n >= _HEDGE_MIN_SAMPLES and self._samples % 16 == 0:  # not every call: it sorts 256 floats
            xs = sorted(self._latencies)
            q = xs[min(n - 1, int(self.hedge_quantile * n))]
            self._hedge_delay = min(self.hedge_max_s, max(self.hedge_min_s, q))

    def _unwait(self, wake: asyncio.Future[None]) -> None:
        for waiters in self._waiters.values():
            waiters.discard(wake)

    def _take_hedge_token(self) -> bool:
        if self._hedge_tokens >= 1.0:
            self._hedge_tokens -= 1.0
            return True
        self.hedges_denied += 1
        return False

    # --- requests --------------------------------------------------------------------------------------
    async def _post_once(
        self, url: str, body: dict[str, Any], n_queries: int, timeout: float
    ) -> list[list[Hit]]:
        session = self._get_session()
        assert self._slots is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=min(self.pool_timeout_s, timeout))
        except asyncio.TimeoutError:
            raise _Retryable(
                f"no free connection slot within {self.pool_timeout_s:g}s ({self.max_connections} in use); "
                "raise max_connections or lower concurrency",
                kind="pool",
            ) from None
        st = self._stats[url]
        st.sent += 1
        st.outstanding += 1
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(session, url, body, n_queries)
        except asyncio.TimeoutError:
            raise _Retryable(f"timeout after {timeout:.3g}s at {url}", kind="timeout") from None
        finally:
            st.outstanding -= 1
            self._slots.release()

    async def _exchange(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any], n_queries: int
    ) -> list[list[Hit]]:
        try:
            async with session.post(url, json=body, headers=self._headers()) as resp:
                status = resp.status
                if status == 200:
                    try:
                        payload = await resp.json(content_type=None)
                    except (ValueError, aiohttp.ContentTypeError):
                        raise RetrievalUnavailableError(
                            f"{url} answered 200 with a non-JSON body", kind="malformed"
                        ) from None
                    return parse_result(payload, n_queries)
                detail = await _detail(resp)
                message = f"{url} answered HTTP {status}: {detail}"
                if status == 429 or status >= 500:
                    raise _Retryable(
                        message,
                        kind=f"http_{status}",
                        status=status,
                        retry_after=_parse_retry_after(resp.headers.get("Retry-After")),
                    )
                raise RetrievalUnavailableError(message, kind=f"http_{status}", status=status)
        except aiohttp.ConnectionTimeoutError:
            raise _Retryable(
                f"cannot connect to {url} within {self.connect_timeout_s:g}s", kind="connect"
            ) from None
        except aiohttp.ServerTimeoutError:
            raise _Retryable(
                f"timeout after {self.timeout_s:g}s reading from {url}", kind="timeout"
            ) from None
        except aiohttp.ClientSSLError as exc:  # not retried: the same certificate fails the same way
            reason = (
                getattr(exc, "certificate_error", None)
                or getattr(exc, "strerror", None)
                or type(exc).__name__
            )
            raise RetrievalUnavailableError(
                f"TLS to {url} failed ({reason}): trust the service's certificate with {CA_BUNDLE_ENV}=<PEM file> "
                "(docs/deploy.md section 7)",
                kind="tls",
            ) from None
        except aiohttp.ClientConnectionError as exc:
            raise _Retryable(f"cannot connect to {url} ({type(exc).__name__})", kind="connect") from None
        except aiohttp.ClientPayloadError as exc:
            raise _Retryable(f"broken response from {url} ({type(exc).__name__})", kind="connect") from None

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
                self._post_once(url, body, n_queries, min(self.timeout_s, remaining))
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
        last: _Retryable | None = None
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
                    hedge_at = started[primary] + self._hedge_delay if may_hedge else None
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
                    if free or self._take_hedge_token():
                        may_hedge = False  # one hedge per primary
                        # with one URL, the same URL on another connection (a wedged connection is cured)
                        more = order if len(self.urls) > 1 else iter(self.urls)
                        hedge = self._launch(more, racing, body, n_queries, deadline)
                        if hedge is not None:
                            started[hedge] = time.monotonic()
                            self.hedges += 1
                        elif not free:
                            self._hedge_tokens += 1.0  # nowhere to send it: the token is not spent
                for task in done:
                    if task is wake:
                        continue
                    url = racing.pop(task)
                    exc = task.exception()
                    if exc is None:
                        self._stats[url].ok += 1
                        self.breakers[url].record_success()
                        self._note_latency(time.monotonic() - started[task])
                        if task is not primary:
                            self.hedges_won += 1
                            if primary in racing:
                                self._record_outrun(racing[primary])
                        return task.result()
                    if not isinstance(exc, RetrievalUnavailableError):
                        raise exc
                    log.debug("retrieval attempt failed: %s", exc)
                    self._record_failure(url, exc)
                    if not isinstance(exc, _Retryable):
                        self.breakers[url].release_probe()
                        raise exc
                    last = exc
        finally:
            for task, url in racing.items():
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
        raise _Retryable(
            f"all {len(self.urls)} retrieval URL(s) are failing (circuit breakers open): {errors or 'deadline'}",
            kind=kinds[-1] if kinds else "timeout",
            retry_after=wait,
        )

    def _wait(self, state: RetryCallState) -> float:
        backoff = wait_random_exponential(multiplier=self.backoff_base_s, max=self.backoff_max_s)(state)
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        return max(backoff, min(retry_after, 60.0)) if retry_after is not None else backoff

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Top-`topk` hits per query, in query order; raises RetrievalUnavailableError when all tries fail."""
        queries = list(queries)
        if not queries:
            return []
        body = {"queries": queries, "topk": int(topk), "return_scores": True}
        self.calls += 1
        self._hedge_tokens = min(_HEDGE_BURST, self._hedge_tokens + self.hedge_budget)
        started = time.monotonic()
        deadline = started + self.deadline_s
        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
                # stop_before_delay: never start a wait (back-off or Retry-After) that ends past the deadline
                stop=stop_after_attempt(self.max_retries + 1) | stop_before_delay(self.deadline_s),
                wait=self._wait,
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        self.retries += 1
                    return await self._attempt(body, len(queries), deadline)
        except _Retryable as exc:
            # Re-raise as the public type so callers never see the internal class.
            raise RetrievalUnavailableError(
                f"{exc} (after {attempts} attempts over {len(self.urls)} URL(s) in "
                f"{time.monotonic() - started:.1f}s)",
                kind=exc.kind,
                status=exc.status,
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> RetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _consume(task: asyncio.Task[Any]) -> None:
    """Done-callback of a cancelled loser: fetch its outcome so asyncio never logs it as unretrieved."""
    if not task.cancelled():
        task.exception()


async def _detail(resp: aiohttp.ClientResponse) -> str:
    try:
        payload = await resp.json(content_type=None)
        if isinstance(payload, dict) and "detail" in payload:
            return str(payload["detail"])[:300]
    except (ValueError, aiohttp.ContentTypeError):
        pass
    text = await resp.text()
    return text[:300] or resp.reason or "no body"


@dataclass(frozen=True)
class HealthResult:
    ok: bool
    reason: str  # one line: "ok: 3 passages in 12 ms" or why not
    latency_s: float | None = None
    hits: list[Hit] = field(default_factory=list)
    # True when the last try got no answer at all (unreachable, timed out, 5xx/429): an outage that waiting or a
    # restart may end, apart from answers that cannot get better (401, malformed, no passages)
    outage: bool = False


def check_health(
    url: str,
    api_key: str | None = None,
    *,
    deadline_s: float = 10.0,
    query: str = HEALTH_QUERY,
    topk: int = 3,
    interval_s: float = 0.5,
    ca_bundle: str | Path | None = None,
) -> HealthResult:
    """POST a real query until a correct answer or the deadline; never raises for service problems.

    Keeps trying while the service is unreachable or answers 5xx/429 (it may still be loading its index), and
    stops at once on an answer that cannot get better by waiting (401, other 4xx, malformed body).
    """
    deadline = time.monotonic() + deadline_s

    async def _probe() -> HealthResult:
        client = RetrievalClient(
            url, api_key, timeout_s=max(1.0, min(10.0, deadline_s)), max_retries=0, ca_bundle=ca_bundle
        )
        try:
            while True:
                started = time.monotonic()
                try:
                    hits = (await client.search([query], topk))[0]
                except RetrievalUnavailableError as exc:
                    retryable = (
                        exc.kind in {"timeout", "connect", "pool"}
                        or (exc.status or 0) >= 500
                        or exc.status == 429
                    )
                    reason = _health_reason(exc)
                    if not retryable or time.monotonic() + interval_s > deadline:
                        return HealthResult(False, reason, outage=retryable)
                    await asyncio.sleep(interval_s)
                    continue
                latency = time.monotonic() - started
                if not hits:
                    return HealthResult(
                        False, "wrong answer: no passages returned for the health query", latency
                    )
                return HealthResult(
                    True,
                    f"ok: {len(hits)} passages in {latency * 1000:.0f} ms (top: {hits[0].title})",
                    latency,
                    hits,
                )
        finally:
            await client.aclose()

    try:
        return asyncio.run(_probe())
    except ConfigError as exc:
        return HealthResult(False, str(exc))


def _health_reason(exc: RetrievalUnavailableError) -> str:
    if exc.status == 401:
        return f"unauthorized (401): wrong or missing RETRIEVAL_API_KEY ({exc})"
    if exc.kind == "connect":
        return f"unreachable: {exc}"
    if exc.kind == "timeout":
        return f"timed out: {exc}"
    if exc.kind == "malformed":
        return f"malformed response: {exc}"
    return str(exc)


def summarize_client_stats(stats: dict[str, Any]) -> str:
    """`RetrievalClient.stats()` as one log line: calls, retries, then per URL sent/ok, failures by kind and
    the breaker state (`open x2` = opened twice so far)."""
    parts = [
        f"{stats['calls']} calls, {stats['retries']} retries, {stats.get('hedges', 0)} hedges "
        f"({stats.get('hedges_won', 0)} won, {stats.get('hedges_denied', 0)} over budget)"
    ]
    for url, st in stats["urls"].items():
        failed = ",".join(f"{k}={v}" for k, v in sorted(st["failed"].items())) or "none"
        breaker = st["breaker"] + (f" x{st['breaker_opened']}" if st["breaker_opened"] else "")
        outrun = f" outrun {st['outrun']}" if st.get("outrun") else ""
        parts.append(f"{url}: sent {st['sent']} ok {st['ok']}{outrun} failed {failed} breaker {breaker}")
    return "; ".join(parts)


__all__ = [
    "CA_BUNDLE_ENV",
    "HEALTH_QUERY",
    "CircuitBreaker",
    "HealthResult",
    "Hit",
    "RetrievalClient",
    "check_health",
    "parse_result",
    "summarize_client_stats",
    "tls_context",
]
