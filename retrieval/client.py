"""RetrievalClient: the only code that calls /retrieve (used by the verl tool, the agent loop and health checks).

Why aiohttp: under RL rollouts a client has 100+ requests in flight; on this class of machine httpx's
AsyncClient tops out near 260 requests/s while aiohttp reaches thousands (../shared/DESIGN.md section 5).

Failure policy (tenacity): each attempt tries the URLs in order (failover); connection errors, timeouts, 429 and
5xx move on to the next URL, and once every URL failed the attempt waits a jittered exponential back-off (or the
server's Retry-After, if longer) before the next attempt. Other 4xx (bad request, wrong token) are not retried:
repeating them cannot help. Every failure surfaces as `RetrievalUnavailableError` with a short `kind`
("timeout", "connect", "http_401", "http_503", "malformed") for metrics; messages never contain the API key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.prompt import split_title

log = logging.getLogger(__name__)

HEALTH_QUERY = "Who directed The Seventh Seal?"


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


class RetrievalClient:
    """Async client for one or more replicas of the retrieval service.

    Construction does no I/O (verl builds tools in processes that never call them); the aiohttp session is
    created on first use in the running event loop, and re-created if the loop changes.
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
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
            self._loop = loop
        return self._session

    async def _post_once(self, url: str, body: dict[str, Any], n_queries: int) -> list[list[Hit]]:
        session = self._get_session()
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
        except asyncio.TimeoutError:
            raise _Retryable(f"timeout after {self.timeout_s:g}s at {url}", kind="timeout") from None
        except aiohttp.ClientConnectionError as exc:
            raise _Retryable(f"cannot connect to {url} ({type(exc).__name__})", kind="connect") from None

    async def _attempt(self, body: dict[str, Any], n_queries: int) -> list[list[Hit]]:
        """One attempt: try each URL in order and return the first answer."""
        last: _Retryable | None = None
        for url in self.urls:
            try:
                return await self._post_once(url, body, n_queries)
            except _Retryable as exc:
                log.debug("retrieval attempt failed: %s", exc)
                last = exc
        assert last is not None
        raise last

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
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
                stop=stop_after_attempt(self.max_retries + 1),
                wait=self._wait,
                reraise=True,
            ):
                with attempt:
                    return await self._attempt(body, len(queries))
        except _Retryable as exc:
            # Re-raise as the public type so callers never see the internal class.
            raise RetrievalUnavailableError(
                f"{exc} (after {self.max_retries + 1} attempts over {len(self.urls)} URL(s))",
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


def check_health(
    url: str,
    api_key: str | None = None,
    *,
    deadline_s: float = 10.0,
    query: str = HEALTH_QUERY,
    topk: int = 3,
    interval_s: float = 0.5,
) -> HealthResult:
    """POST a real query until a correct answer or the deadline; never raises for service problems.

    Keeps trying while the service is unreachable or answers 5xx/429 (it may still be loading its index), and
    stops at once on an answer that cannot get better by waiting (401, other 4xx, malformed body).
    """
    deadline = time.monotonic() + deadline_s

    async def _probe() -> HealthResult:
        client = RetrievalClient(url, api_key, timeout_s=max(1.0, min(10.0, deadline_s)), max_retries=0)
        try:
            while True:
                started = time.monotonic()
                try:
                    hits = (await client.search([query], topk))[0]
                except RetrievalUnavailableError as exc:
                    retryable = (
                        exc.kind in {"timeout", "connect"} or (exc.status or 0) >= 500 or exc.status == 429
                    )
                    reason = _health_reason(exc)
                    if not retryable or time.monotonic() + interval_s > deadline:
                        return HealthResult(False, reason)
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


__all__ = ["HEALTH_QUERY", "HealthResult", "Hit", "RetrievalClient", "check_health", "parse_result"]
