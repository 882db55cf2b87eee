"""`WebBackend`: what every web search provider shares (client, rate limit, budget, retries, error mapping,
blocklist, page mode); each provider (cse.py, serper.py, serpapi.py, searxng.py) builds its own requests.

Each result becomes a Search-R1 document: `id` = the URL, `contents` = '"Title"\\nsnippet', plus `url`.
Scores are rank-based (1/rank): web APIs return an order, not a score.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr
from tenacity import RetryCallState

from searchrl.errors import BackendError, ConfigError, QuotaExceededError, RetryableError
from searchrl.http import retry_after_s, retrying
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.backends.web.page_text import page_passage
from searchrl.retrieval.backends.web.pages import PageFetcher, PageFetchError, loggable
from searchrl.retrieval.backends.web.throttle import DailyBudget, RateLimiter
from searchrl.retrieval.backends.web.transport import SecretTransport, upstream_message
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


def _clean(text: Any) -> str:
    """Collapse the newlines and non-breaking spaces web snippets carry into single spaces."""
    return " ".join(str(text or "").split())


def make_document(title: str, snippet: str, url: str, **extra: Any) -> Document:
    """A Search-R1 document for a web hit: the id is the URL, contents is '"Title"\\nsnippet'."""
    # Document allows extra fields (schemas.py): model_validate takes them, as the wire format does
    return Document.model_validate(
        {"id": url, "contents": f'"{_clean(title)}"\n{_clean(snippet)}', "url": url, **extra}
    )


def organic_documents(results: list[Any]) -> list[Document]:
    """Documents from Google's organic results as Serper and SerpAPI both list them ({title, snippet, link})."""
    return [
        make_document(o.get("title", ""), o.get("snippet", ""), o["link"]) for o in results if o.get("link")
    ]


def rank_scored(docs: list[Document], topk: int) -> list[ScoredDocument]:
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
    provider: str | None = None  # GoogleBackend names the SERP provider behind it; GET / reports it
    #: the env vars a 401/403 points the user at
    credentials_hint = ""
    #: what the provider's HTTP 429 message says (lower case) when the daily quota is spent, not the rate limit;
    #: "" = it never tells them apart, so every 429 is retried as a rate limit
    daily_quota_phrase = ""

    def __init__(
        self,
        settings: RetrievalSettings,
        *,
        base_url: str,
        secret_params: dict[str, SecretStr] | None = None,
        secret_headers: dict[str, SecretStr] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """The limits, retries, locale, blocklist and page mode come from `settings` (its `web_*` fields and
        `request_timeout_s`), where their defaults and bounds are declared once; `base_url` and the secrets
        are the provider's (each subclass's `from_settings`)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{self.name}: base URL {base_url!r} is not an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = settings.web_timeout_s
        self.max_retries = settings.web_max_retries
        self.backoff_base_s = settings.web_backoff_base_s
        self.backoff_max_s = settings.web_backoff_max_s
        self.concurrency = settings.web_concurrency
        self.rate_limiter = RateLimiter(settings.web_rate_limit_rps)
        self.rate_limit_rps = settings.web_rate_limit_rps
        self.budget = DailyBudget(settings.web_daily_budget, clock=clock)
        self._secret_params = secret_params or {}
        self._secret_headers = secret_headers or {}
        self._secrets = [
            s.get_secret_value()
            for s in [*self._secret_params.values(), *self._secret_headers.values()]
            if s.get_secret_value()
        ]
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self.gl, self.hl = settings.web_gl, settings.web_hl
        self.blocklist = [d.lower().lstrip(".") for d in settings.web_blocklist]
        self.page_mode = settings.web_page_mode
        self.page_words = settings.web_page_words
        # page fetching ends within this many seconds of the request's start (the service's request deadline)
        self.request_timeout_s = settings.request_timeout_s
        # the page limits live in the fetcher only, which applies them
        self._pages = PageFetcher(
            timeout_s=settings.web_page_timeout_s,
            max_bytes=settings.web_page_max_bytes,
            allow_private=settings.web_page_allow_private,
            host_blocked=self._host_blocked,  # every redirect hop, not only the result's own URL
        )
        self._metrics: Any = None
        self.blocked_results = 0
        self.page_fetch_failures = 0

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is not None:
            return
        transport = SecretTransport(
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
            "provider": self.provider or self.name,
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
        """Provider hits minus blocklisted sites, cut to top-k; in page mode each becomes a page passage. A blank
        query finds nothing, without asking the provider."""
        if not query.strip():
            return []
        want = topk + (self.extra_results if self.blocklist else 0)
        hits = await self._search_one(query, want)
        kept = [h for h in hits if not self._blocked(h.document.id)]
        self.blocked_results += len(hits) - len(kept)
        docs = [h.document for h in kept[:topk]]
        if self.page_mode:
            docs = list(await asyncio.gather(*(self.page_passage(d, query, deadline) for d in docs)))
        return rank_scored(docs, topk)

    async def page_passage(self, doc: Document, query: str, deadline: float) -> Document:
        """The result page's ~`page_words`-word passage that best matches the query; the snippet on failure.

        Fetching is guarded by `pages.PageFetcher` (public addresses only, byte cap, one time budget that
        ends by the request's deadline); parsing runs in a worker thread so the event loop keeps answering.
        """
        title = doc.contents.split("\n", 1)[0]
        try:
            page = await self._pages.fetch(doc.id, timeout_s=deadline - time.monotonic())
            passage = await asyncio.to_thread(page_passage, page.body, page.charset, query, self.page_words)
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
        """Up to `topk` hits for one (non-blank) query (an empty list only when the provider found nothing)."""

    # --- HTTP --------------------------------------------------------------------------------------------
    def _public_url(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        """One logical request with budget, rate limit, retries; returns the decoded JSON body.

        Retries follow searchrl/http.py (`retrying`): jittered exponential back-off, or the provider's Retry-After
        (seconds or an HTTP date) up to `backoff_max_s`. Every attempt spends the budget: it bounds the bill.
        """
        assert self._client is not None and self._sem is not None
        attempts = self.max_retries + 1

        def warn(state: RetryCallState) -> None:
            log.warning(
                "%s: %s (attempt %d/%d); retrying in %.2fs",
                self.name,
                state.outcome.exception() if state.outcome else "?",
                state.attempt_number,
                attempts,
                state.upcoming_sleep,
            )

        try:
            async for attempt in retrying(
                attempts=attempts, base_s=self.backoff_base_s, max_s=self.backoff_max_s, before_sleep=warn
            ):
                with attempt:
                    self.budget.spend(self.name)
                    if self._metrics is not None:  # retries spend the budget too: /metrics shows how many
                        self._metrics.count_upstream_request(
                            self.name, retry=attempt.retry_state.attempt_number > 1
                        )
                    await self.rate_limiter.acquire()
                    async with self._sem:
                        return await self._attempt(method, url, **kwargs)
        except RetryableError as exc:
            raise (exc.error or exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, method: str, url: str, **kwargs: Any) -> Any:
        assert self._client is not None
        started = time.perf_counter()
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TimeoutException:
            raise RetryableError(
                f"timeout after {self.timeout_s:g}s",
                error=BackendError(
                    f"{self.name}: {self._public_url()} timed out after {self.timeout_s:g}s "
                    f"({self.max_retries + 1} attempts); raise SEARCHRL_RETRIEVAL_WEB_TIMEOUT_S or retry later"
                ),
            ) from None
        except httpx.TransportError as exc:
            raise RetryableError(
                type(exc).__name__,
                error=BackendError(
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
        message = self._redact(upstream_message(response))
        if status == 429:
            if self._is_daily_quota(message):
                raise QuotaExceededError(
                    f"{self.name}: the provider's daily quota is spent (HTTP 429: {message}); "
                    "wait for the reset or raise the quota in the provider console"
                )
            raise RetryableError(
                "HTTP 429",
                error=QuotaExceededError(
                    f"{self.name}: upstream rate limit (HTTP 429: {message}) persisted through "
                    f"{self.max_retries + 1} attempts; lower SEARCHRL_RETRIEVAL_WEB_RATE_LIMIT_RPS"
                ),
                retry_after=retry_after_s(response.headers.get("retry-after")),
            )
        if status >= 500:
            raise RetryableError(
                f"HTTP {status}",
                error=BackendError(
                    f"{self.name}: upstream error HTTP {status}: {message} "
                    f"(after {self.max_retries + 1} attempts)"
                ),
                retry_after=retry_after_s(response.headers.get("retry-after")),
            )
        hint = (
            f"; check {self.credentials_hint}" if status in (400, 401, 403) and self.credentials_hint else ""
        )
        raise BackendError(f"{self.name}: upstream rejected the request: HTTP {status}: {message}{hint}")

    def _is_daily_quota(self, message: str) -> bool:
        return bool(self.daily_quota_phrase) and self.daily_quota_phrase in message.lower()


def require_secrets(backend: str, **secrets: SecretStr | None) -> list[SecretStr]:
    """The named secrets, or one ConfigError naming every missing environment variable (never a value)."""
    missing = [name for name, value in secrets.items() if not value or not value.get_secret_value()]
    if missing:
        raise ConfigError(
            f"backend '{backend}' needs {' and '.join(missing)} in the environment "
            "(pass them with --secret, never on the command line)"
        )
    return [value for value in secrets.values() if value is not None]


__all__ = [
    "WebBackend",
    "make_document",
    "organic_documents",
    "rank_scored",
    "require_secrets",
]
