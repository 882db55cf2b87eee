"""Web search backends: Google results through a SERP provider (Serper, SerpAPI), SearXNG, and the closing
Google Custom Search JSON API, behind the same /retrieve.

    SEARCHRL_RETRIEVAL_BACKEND=google SERPER_API_KEY=... searchrl serve            # Google via Serper
    SEARCHRL_RETRIEVAL_BACKEND=google SEARCHRL_RETRIEVAL_GOOGLE_PROVIDER=serpapi SERPAPI_API_KEY=... searchrl serve

`google` means Google's results bought from a SERP provider (Serper by default; SerpAPI, which Search-R1
recommends). `google-cse` is Google's Custom Search JSON API: closed to new customers, and its whole-web search
ends on 2027-01-01 (only site search over up to 50 domains remains), so it warns at start.
Every provider is asked with the same pinned country and language (`gl`, `hl`), results from sites that host
the benchmarks' Q/A pairs are dropped (`web_blocklist`), and in page mode (`web_page_mode`) the result pages are
fetched, cleaned and cut into ~100-word passages, so a web run reads passages of the size Wikipedia runs read
instead of two-line snippets. Page fetching and its guard (public addresses only, a byte cap, a time budget per
page within the request's deadline) live in retrieval/web_pages.py.

The trainer and the agent only speak /retrieve, so swapping Wikipedia for the web is a service setting. What
public web wrappers lack, and these add: a timeout per request, retries with jittered exponential back-off on
429/5xx/timeouts (honouring Retry-After), a client-side rate limit, a daily request budget that fails loudly
(`QuotaExceededError`, HTTP 429 at the app) instead of running up a bill, and explicit `BackendError`s instead
of silently empty result lists.

Secrets: the Google key travels as the `key=` query parameter (the documented way). It is added to the URL by
`_SecretTransport` below the httpx client, so the `httpx.Request` that httpx logs ("HTTP Request: GET ...")
and that our messages could mention never holds it; upstream error text is also scrubbed of it.

Each result becomes a Search-R1 document: `id` = the URL, `contents` = '"Title"\\nsnippet', plus `url`.
Scores are rank-based (1/rank): web APIs return an order, not a score.
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr

from searchrl.errors import BackendError, ConfigError, QuotaExceededError
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings
from searchrl.retrieval.web_pages import PageFetcher, PageFetchError, loggable

log = logging.getLogger(__name__)

# Custom Search returns at most 100 results, 10 per request; start + num above 100 is an error.
# https://developers.google.com/custom-search/v1/reference/rest/v1/cse/list
GOOGLE_MAX_NUM = 10
GOOGLE_MAX_RESULTS = 100
SERPER_MAX_NUM = 100
SERPAPI_MAX_NUM = 100
SEARXNG_MAX_PAGES = 10
CSE_SUNSET = "2027-01-01"


class RateLimiter:
    """Spaces upstream requests at least 1/rate seconds apart (rate 0 = unlimited).

    Single event loop, so reserving a slot (read + write of `_next`, no await in between) is atomic.
    """

    def __init__(self, rate_per_s: float) -> None:
        self._interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self._next = 0.0

    async def acquire(self) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        slot = max(now, self._next)
        self._next = slot + self._interval
        if slot > now:
            await asyncio.sleep(slot - now)


class DailyBudget:
    """Counts upstream requests per UTC day and refuses the one past `limit` (0 = unlimited).

    Every request sent counts, retries included, so the budget bounds what the provider can bill. The count
    lives in this process: each replica has its own budget (set it to the provider quota / replicas).
    """

    def __init__(self, limit: int, *, clock: Callable[[], float] = time.time) -> None:
        self.limit = limit
        self._clock = clock
        self._day = ""
        self.used = 0
        self._lock = threading.Lock()

    def _today(self) -> str:
        return dt.datetime.fromtimestamp(self._clock(), tz=dt.timezone.utc).date().isoformat()

    def spend(self, provider: str) -> None:
        with self._lock:
            day = self._today()
            if day != self._day:
                self._day, self.used = day, 0
            if self.limit and self.used >= self.limit:
                raise QuotaExceededError(
                    f"{provider}: the daily request budget of {self.limit} is spent ({self.used} requests on "
                    f"{day} UTC); it resets at 00:00 UTC, or raise SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET"
                )
            self.used += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            used = self.used if self._day == self._today() else 0
        return {"daily_budget": self.limit, "requests_today": used}


class _SecretTransport(httpx.AsyncBaseTransport):
    """Adds secret query parameters and headers to each request on its way to the network.

    Below the client, so the request object httpx logs and attaches to errors never carries the secrets.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        params: dict[str, SecretStr] | None = None,
        headers: dict[str, SecretStr] | None = None,
    ) -> None:
        self._inner = inner
        self._params = params or {}
        self._headers = headers or {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url.copy_merge_params({k: v.get_secret_value() for k, v in self._params.items()})
        headers = request.headers.copy()
        for name, value in self._headers.items():
            headers[name] = value.get_secret_value()
        signed = httpx.Request(
            request.method, url, headers=headers, stream=request.stream, extensions=request.extensions
        )
        return await self._inner.handle_async_request(signed)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Retryable(Exception):
    """An attempt failed in a way worth retrying; `error` is what to raise if no attempt is left."""

    def __init__(self, reason: str, error: BackendError, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.error = error
        self.retry_after = retry_after


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date; rare from APIs, fall back to our own back-off


def _upstream_message(response: httpx.Response) -> str:
    """The provider's own error text: Google {"error": {"message"}}, Serper {"message"}, else the body."""
    try:
        body = response.json()
    except ValueError:
        return " ".join(response.text.split())[:300] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return json.dumps(body)[:300]


def _clean(text: Any) -> str:
    """Collapse the newlines and non-breaking spaces web snippets carry into single spaces."""
    return " ".join(str(text or "").split())


def make_document(title: str, snippet: str, url: str, **extra: Any) -> Document:
    """A Search-R1 document for a web hit: the id is the URL, contents is '"Title"\\nsnippet'."""
    return Document(id=url, contents=f'"{_clean(title)}"\n{_clean(snippet)}', url=url, **extra)


def _rank_scored(docs: list[Document], topk: int) -> list[ScoredDocument]:
    """Deduplicate by URL (pages overlap when results shift) and give rank-based scores 1/rank."""
    out: list[ScoredDocument] = []
    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            continue
        seen.add(doc.id)
        out.append(ScoredDocument(document=doc, score=1.0 / (len(out) + 1)))
        if len(out) == topk:
            break
    return out


class WebBackend(Backend):
    """Shared plumbing of the web backends: client, rate limit, budget, retries and error mapping.

    Subclasses build one provider's requests in `_search_one` and call `_request` for each HTTP exchange.
    """

    name = "web"
    #: the env vars a 401/403 points the user at
    credentials_hint = ""

    def __init__(
        self,
        *,
        base_url: str,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        rate_limit_rps: float = 5.0,
        daily_budget: int = 100,
        concurrency: int = 8,
        secret_params: dict[str, SecretStr] | None = None,
        secret_headers: dict[str, SecretStr] | None = None,
        clock: Callable[[], float] = time.time,
        gl: str = "us",
        hl: str = "en",
        blocklist: list[str] | None = None,
        page_mode: bool = False,
        page_words: int = 100,
        page_timeout_s: float = 5.0,
        page_max_bytes: int = 2_000_000,
        page_allow_private: bool = False,
        request_timeout_s: float = 8.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{self.name}: base URL {base_url!r} is not an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.concurrency = concurrency
        self.rate_limiter = RateLimiter(rate_limit_rps)
        self.rate_limit_rps = rate_limit_rps
        self.budget = DailyBudget(daily_budget, clock=clock)
        self._secret_params = secret_params or {}
        self._secret_headers = secret_headers or {}
        self._secrets = [
            s.get_secret_value()
            for s in [*self._secret_params.values(), *self._secret_headers.values()]
            if s.get_secret_value()
        ]
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self.gl, self.hl = gl, hl
        self.blocklist = [d.lower().lstrip(".") for d in (blocklist or [])]
        self.page_mode = page_mode
        self.page_words = page_words
        self.page_timeout_s = page_timeout_s
        self.page_max_bytes = page_max_bytes
        self.page_allow_private = page_allow_private
        # page fetching ends within this many seconds of the request's start (the service's request deadline)
        self.request_timeout_s = request_timeout_s
        self._pages = PageFetcher(
            timeout_s=page_timeout_s,
            max_bytes=page_max_bytes,
            allow_private=page_allow_private,
            host_blocked=self._host_blocked,  # every redirect hop, not only the result's own URL
        )
        self._metrics: Any = None
        self.blocked_results = 0
        self.page_fetch_failures = 0

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is not None:
            return
        transport = _SecretTransport(
            httpx.AsyncHTTPTransport(), params=self._secret_params, headers=self._secret_headers
        )
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(self.timeout_s),
            headers={"User-Agent": "searchrl-retrieval"},
        )
        self._sem = asyncio.Semaphore(self.concurrency)
        log.info(
            "%s backend ready: %s (timeout %.1fs, %d retries, %.1f req/s, budget %s/day)",
            self.name,
            self._public_url(),
            self.timeout_s,
            self.max_retries,
            self.rate_limit_rps,
            self.budget.limit or "unlimited",
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await self._pages.aclose()

    def attach_metrics(self, metrics: Any) -> None:
        """The app's metrics sink: page-mode failures by reason (`count_page_failure`), provider requests by
        first try or retry (`count_upstream_request`)."""
        self._metrics = metrics

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "provider": getattr(self, "provider", self.name),
            "upstream": self._public_url(),
            "rate_limit_rps": self.rate_limit_rps,
            "gl": self.gl,
            "hl": self.hl,
            "blocklist_sha256": hashlib.sha256(",".join(sorted(self.blocklist)).encode()).hexdigest()[:12],
            "blocked_results": self.blocked_results,
            "page_mode": self.page_mode,
            "page_fetch_failures": self.page_fetch_failures,
            **self.budget.snapshot(),
        }

    #: extra results asked for per query, so dropping blocklisted hits still leaves top-k (free for
    #: providers that return up to 100 per request; CSE pages by 10, each page billed, so it asks for none)
    extra_results = 5

    def _blocked(self, url: str) -> bool:
        return self._host_blocked((urlsplit(url).hostname or "").lower())

    def _host_blocked(self, host: str) -> bool:
        return any(host == d or host.endswith("." + d) for d in self.blocklist)

    # --- search ------------------------------------------------------------------------------------------
    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        if self._client is None:
            await self.start()
        deadline = time.monotonic() + self.request_timeout_s
        outcomes = await asyncio.gather(
            *(self._search_filtered(q, topk, deadline) for q in queries), return_exceptions=True
        )
        results: list[list[ScoredDocument]] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, BackendError):
                    raise outcome
                raise BackendError(f"{self.name}: unexpected {type(outcome).__name__}") from outcome
            results.append(outcome)
        return results

    async def _search_filtered(self, query: str, topk: int, deadline: float) -> list[ScoredDocument]:
        """Provider hits minus blocklisted sites, cut to top-k; in page mode each becomes a page passage."""
        want = topk + (self.extra_results if self.blocklist else 0)
        hits = await self._search_one(query, want)
        kept = [h for h in hits if not self._blocked(h.document.id)]
        self.blocked_results += len(hits) - len(kept)
        docs = [h.document for h in kept[:topk]]
        if self.page_mode:
            docs = list(await asyncio.gather(*(self._page_passage(d, query, deadline) for d in docs)))
        return _rank_scored(docs, topk)

    async def _page_passage(self, doc: Document, query: str, deadline: float) -> Document:
        """The result page's ~`page_words`-word passage that best matches the query; the snippet on failure.

        Fetching is guarded by `web_pages.PageFetcher` (public addresses only, byte cap, one time budget that
        ends by the request's deadline); parsing runs in a worker thread so the event loop keeps answering.
        """
        title = doc.contents.split("\n", 1)[0]
        try:
            page = await self._pages.fetch(doc.id, timeout_s=deadline - time.monotonic())
            passage = await asyncio.to_thread(_page_passage, page.body, page.charset, query, self.page_words)
        except PageFetchError as exc:
            self.page_fetch_failures += 1
            if self._metrics is not None:
                self._metrics.count_page_failure(exc.reason)
            url = loggable(doc.id)
            log.info("%s: page %s not used (%s: %s); keeping the snippet", self.name, url, exc.reason, exc)
            return doc
        if not passage:
            return doc
        return doc.model_copy(update={"contents": f"{title}\n{passage}"})

    @abc.abstractmethod
    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        """Up to `topk` hits for one query (an empty list only when the provider found nothing)."""

    # --- HTTP --------------------------------------------------------------------------------------------
    def _public_url(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        """One logical request with budget, rate limit, retries; returns the decoded JSON body."""
        assert self._client is not None and self._sem is not None
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            self.budget.spend(self.name)
            if self._metrics is not None:  # retries spend the budget too: /metrics shows how many
                self._metrics.count_upstream_request(self.name, retry=attempt > 1)
            await self.rate_limiter.acquire()
            try:
                async with self._sem:
                    return await self._attempt(method, url, **kwargs)
            except _Retryable as exc:
                if attempt == attempts:
                    raise exc.error from None
                delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
                delay = delay * (0.5 + random.random() / 2)  # jitter spreads synchronized retries
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.backoff_max_s))
                log.warning(
                    "%s: %s (attempt %d/%d); retrying in %.2fs", self.name, exc, attempt, attempts, delay
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, method: str, url: str, **kwargs: Any) -> Any:
        assert self._client is not None
        started = time.perf_counter()
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TimeoutException:
            raise _Retryable(
                f"timeout after {self.timeout_s:g}s",
                BackendError(
                    f"{self.name}: {self._public_url()} timed out after {self.timeout_s:g}s "
                    f"({self.max_retries + 1} attempts); raise SEARCHRL_RETRIEVAL_WEB_TIMEOUT_S or retry later"
                ),
            ) from None
        except httpx.TransportError as exc:
            raise _Retryable(
                type(exc).__name__,
                BackendError(
                    f"{self.name}: cannot reach {self._public_url()} ({type(exc).__name__}: "
                    f"{self._redact(str(exc))}); check the base URL setting and the network"
                ),
            ) from None
        status = response.status_code
        log.debug("%s: HTTP %d in %.0f ms", self.name, status, (time.perf_counter() - started) * 1e3)
        if status == 200:
            try:
                return response.json()
            except ValueError:
                raise BackendError(
                    f"{self.name}: upstream answered HTTP 200 with a body that is not JSON"
                ) from None
        message = self._redact(_upstream_message(response))
        if status == 429:
            if self._is_daily_quota(message):
                raise QuotaExceededError(
                    f"{self.name}: the provider's daily quota is spent (HTTP 429: {message}); "
                    "wait for the reset or raise the quota in the provider console"
                )
            raise _Retryable(
                "HTTP 429",
                QuotaExceededError(
                    f"{self.name}: upstream rate limit (HTTP 429: {message}) persisted through "
                    f"{self.max_retries + 1} attempts; lower SEARCHRL_RETRIEVAL_WEB_RATE_LIMIT_RPS"
                ),
                retry_after=_retry_after_s(response),
            )
        if status >= 500:
            raise _Retryable(
                f"HTTP {status}",
                BackendError(
                    f"{self.name}: upstream error HTTP {status}: {message} "
                    f"(after {self.max_retries + 1} attempts)"
                ),
                retry_after=_retry_after_s(response),
            )
        hint = (
            f"; check {self.credentials_hint}" if status in (400, 401, 403) and self.credentials_hint else ""
        )
        raise BackendError(f"{self.name}: upstream rejected the request: HTTP {status}: {message}{hint}")

    def _is_daily_quota(self, message: str) -> bool:
        return False


class GoogleCSEBackend(WebBackend):
    """Google Programmable Search (Custom Search JSON API): GET with key, cx, q, num (1-10), start.

    Top-k above 10 pages with `start` (1, 11, 21, ...); each page is one billed request. The API never
    returns more than 100 results. https://developers.google.com/custom-search/v1/using_rest
    Closed to new customers; whole-web search ends on 2027-01-01 (DESIGN.md 5b), hence the start-up warning.
    """

    name = "google-cse"
    credentials_hint = "GOOGLE_API_KEY and GOOGLE_CSE_ID"
    extra_results = 0

    async def start(self) -> None:
        log.warning(
            "backend google-cse: Google's Custom Search JSON API is closed to new customers and its whole-web "
            "search ends on %s; use backend google (Serper or SerpAPI) for Google results",
            CSE_SUNSET,
        )
        await super().start()

    def __init__(self, *, api_key: SecretStr, cse_id: SecretStr, **kwargs: Any) -> None:
        self._cse_id_hash = hashlib.sha256(cse_id.get_secret_value().encode()).hexdigest()[:12]
        super().__init__(secret_params={"key": api_key, "cx": cse_id}, **kwargs)

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> GoogleCSEBackend:
        key, cx = _require_secrets(
            "google-cse", GOOGLE_API_KEY=settings.google_api_key, GOOGLE_CSE_ID=settings.google_cse_id
        )
        return cls(api_key=key, cse_id=cx, base_url=settings.google_base_url, **_common_kwargs(settings))

    def info(self) -> dict[str, Any]:
        return {**super().info(), "engine": f"sha256:{self._cse_id_hash}"}

    def _is_daily_quota(self, message: str) -> bool:
        # Google says which limit was hit: "... limit 'Queries per day' ..." vs "... per minute ...".
        return "per day" in message.lower()

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        if not query.strip():
            return []
        want = min(topk, GOOGLE_MAX_RESULTS - 1)
        docs: list[Document] = []
        start = 1
        while len(docs) < want:
            num = min(GOOGLE_MAX_NUM, want - len(docs), GOOGLE_MAX_RESULTS - start)
            if num < 1:
                break
            params = {"q": query, "num": num, "start": start, "gl": self.gl, "hl": self.hl}
            body = await self._request("GET", self.base_url, params=params)
            if not isinstance(body, dict) or ("items" not in body and "searchInformation" not in body):
                raise BackendError(f"google-cse: unexpected response shape (keys: {sorted(body)[:8]})")
            items = body.get("items") or []
            for item in items:
                link = item.get("link")
                if link:
                    docs.append(
                        make_document(
                            item.get("title", ""),
                            item.get("snippet", ""),
                            link,
                            display_link=item.get("displayLink", ""),
                        )
                    )
            next_page = (body.get("queries") or {}).get("nextPage") or []
            if len(items) < num or not next_page:
                break
            start = int(next_page[0].get("startIndex", start + len(items)))
        return _rank_scored(docs, topk)


class SerperBackend(WebBackend):
    """serper.dev Google results: POST JSON {"q", "num"} with the key in the X-API-KEY header."""

    name = "serper"
    credentials_hint = "SERPER_API_KEY"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SerperBackend:
        (key,) = _require_secrets("serper", SERPER_API_KEY=settings.serper_api_key)
        return cls(
            base_url=settings.serper_base_url,
            secret_headers={"X-API-KEY": key},
            **_common_kwargs(settings),
        )

    def _is_daily_quota(self, message: str) -> bool:
        return "credits" in message.lower()

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        if not query.strip():
            return []
        num = min(topk, SERPER_MAX_NUM)
        body = await self._request(
            "POST", self.base_url, json={"q": query, "num": num, "gl": self.gl, "hl": self.hl}
        )
        if not isinstance(body, dict) or not isinstance(body.get("organic", []), list):
            raise BackendError("serper: unexpected response shape (no 'organic' list)")
        docs = [
            make_document(o.get("title", ""), o.get("snippet", ""), o["link"])
            for o in body.get("organic", [])
            if o.get("link")
        ]
        return _rank_scored(docs, topk)


class SerpApiBackend(WebBackend):
    """serpapi.com Google results: GET search.json?engine=google&q&num&gl&hl with the key as `api_key`.

    The key is a query parameter added below the HTTP client (as for CSE), so logs and errors never hold it.
    https://serpapi.com/search-api ; errors come as {"error": "..."}; a spent plan is HTTP 429
    "Your account has run out of searches."
    """

    name = "serpapi"
    credentials_hint = "SERPAPI_API_KEY"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SerpApiBackend:
        (key,) = _require_secrets("serpapi", SERPAPI_API_KEY=settings.serpapi_api_key)
        return cls(
            base_url=settings.serpapi_base_url, secret_params={"api_key": key}, **_common_kwargs(settings)
        )

    def _is_daily_quota(self, message: str) -> bool:
        return "run out of searches" in message.lower()

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        if not query.strip():
            return []
        params = {
            "engine": "google",
            "q": query,
            "num": min(topk, SERPAPI_MAX_NUM),
            "gl": self.gl,
            "hl": self.hl,
        }
        body = await self._request("GET", self.base_url, params=params)
        if not isinstance(body, dict) or not isinstance(body.get("organic_results", []), list):
            raise BackendError("serpapi: unexpected response shape (no 'organic_results' list)")
        if body.get("error") and not body.get("organic_results"):
            if "hasn't returned any results" in str(body["error"]):
                return []
            raise BackendError(f"serpapi: {self._redact(str(body['error']))}")
        docs = [
            make_document(o.get("title", ""), o.get("snippet", ""), o["link"])
            for o in body.get("organic_results", [])
            if o.get("link")
        ]
        return _rank_scored(docs, topk)


class GoogleBackend:
    """Backend `google`: Google's results from the SERP provider `google_provider` names (Serper or SerpAPI)."""

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> WebBackend:
        impl: type[SerperBackend] | type[SerpApiBackend] = (
            SerpApiBackend if settings.google_provider == "serpapi" else SerperBackend
        )
        backend = impl.from_settings(settings)
        backend.name = "google"  # what GET / reports; info() adds the provider
        backend.provider = impl.name  # type: ignore[attr-defined]
        return backend


class SearxngBackend(WebBackend):
    """A SearXNG instance: GET /search?q=...&format=json&pageno=N, no key (json must be enabled).

    SearXNG has no page size: pages are fetched until top-k unique results or an empty page.
    """

    name = "searxng"
    credentials_hint = "that the instance enables the json format (search.formats in settings.yml)"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SearxngBackend:
        return cls(base_url=settings.searxng_base_url, **_common_kwargs(settings))

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        if not query.strip():
            return []
        docs: list[Document] = []
        seen: set[str] = set()
        for page in range(1, SEARXNG_MAX_PAGES + 1):
            body = await self._request(
                "GET", f"{self.base_url}/search", params={"q": query, "format": "json", "pageno": page}
            )
            if not isinstance(body, dict) or not isinstance(body.get("results"), list):
                raise BackendError("searxng: unexpected response shape (no 'results' list)")
            fresh = [r for r in body["results"] if r.get("url") and r["url"] not in seen]
            for r in fresh:
                seen.add(r["url"])
                docs.append(make_document(r.get("title", ""), r.get("content", ""), r["url"]))
            if not fresh or len(docs) >= topk:
                break
        return _rank_scored(docs, topk)


def _require_secrets(backend: str, **secrets: SecretStr | None) -> list[SecretStr]:
    """The named secrets, or one ConfigError naming every missing environment variable (never a value)."""
    missing = [name for name, value in secrets.items() if not value or not value.get_secret_value()]
    if missing:
        raise ConfigError(
            f"backend '{backend}' needs {' and '.join(missing)} in the environment "
            "(pass them with --secret, never on the command line)"
        )
    return [value for value in secrets.values() if value is not None]


def _common_kwargs(settings: RetrievalSettings) -> dict[str, Any]:
    return {
        "timeout_s": settings.web_timeout_s,
        "max_retries": settings.web_max_retries,
        "backoff_base_s": settings.web_backoff_base_s,
        "backoff_max_s": settings.web_backoff_max_s,
        "rate_limit_rps": settings.web_rate_limit_rps,
        "daily_budget": settings.web_daily_budget,
        "concurrency": settings.web_concurrency,
        "gl": settings.web_gl,
        "hl": settings.web_hl,
        "blocklist": settings.web_blocklist,
        "page_mode": settings.web_page_mode,
        "page_words": settings.web_page_words,
        "page_timeout_s": settings.web_page_timeout_s,
        "page_max_bytes": settings.web_page_max_bytes,
        "page_allow_private": settings.web_page_allow_private,
        "request_timeout_s": settings.request_timeout_s,
    }


class _TextExtractor(HTMLParser):
    """Visible text of an HTML page: drops script/style/nav/header/footer/aside/form, keeps block breaks."""

    _SKIP = frozenset(
        {"script", "style", "noscript", "nav", "header", "footer", "aside", "form", "svg", "template"}
    )
    _BLOCK = frozenset(
        {"p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "section", "article"}
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skip:
            self._skip -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def _raw_text(html: str) -> str:
    """Visible text with a line break around each block element, from selectolax (lexbor) if installed.

    selectolax took 62 ms of CPU per MB of HTML where html.parser took 339 (lxml 94), with the same text
    (2 MB article, 2026-11-25); html.parser stays as the fallback when the retrieval extra is not installed.
    """
    try:
        from selectolax.lexbor import LexborHTMLParser
    except ImportError:
        parser = _TextExtractor()
        parser.feed(html)
        parser.close()
        return "".join(parser.parts)
    tree = LexborHTMLParser(html)
    tree.strip_tags(sorted(_TextExtractor._SKIP))  # removes the elements with their content
    for node in tree.css(",".join(sorted(_TextExtractor._BLOCK))):
        node.insert_before("\n")
        node.insert_after("\n")
    top = tree.body or tree.root
    return top.text(deep=True, separator="") if top is not None else ""


def page_text(html: str) -> str:
    """Main text of a page: paragraphs of at least 8 words (menus, buttons and cookie lines are shorter)."""
    paragraphs = [" ".join(p.split()) for p in _raw_text(html).split("\n")]
    return "\n".join(p for p in paragraphs if len(p.split()) >= 8)


def _page_passage(body: bytes, charset: str | None, query: str, words: int) -> str:
    """Decode, clean and window one fetched page (CPU work: called in a worker thread, not on the loop)."""
    try:
        html = body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        html = body.decode("utf-8", errors="replace")
    return best_passage(page_text(html), query, words)


_WORD_RE = re.compile(r"\w+")


def best_passage(text: str, query: str, words: int = 100) -> str:
    """The `words`-word window of `text` (stride half a window) sharing the most query terms; "" if no text."""
    tokens = text.split()
    if not tokens:
        return ""
    q = {w.lower() for w in _WORD_RE.findall(query) if len(w) > 2}
    best, best_score = tokens[:words], -1
    for start in range(0, max(1, len(tokens) - words // 2), max(1, words // 2)):
        window = tokens[start : start + words]
        score = len(q & {w.lower() for t in window for w in _WORD_RE.findall(t)})
        if score > best_score:
            best, best_score = window, score
    return " ".join(best)


__all__ = [
    "CSE_SUNSET",
    "DailyBudget",
    "GoogleBackend",
    "GoogleCSEBackend",
    "RateLimiter",
    "SearxngBackend",
    "SerpApiBackend",
    "SerperBackend",
    "WebBackend",
    "best_passage",
    "page_text",
]
