"""One HTTP exchange with one retrieval replica (aiohttp): the transport under RetrievalClient's policy.

Why aiohttp: under RL rollouts a client has 100+ requests in flight; on this class of machine httpx's
AsyncClient tops out near 260 requests/s while aiohttp reaches thousands (../shared/DESIGN.md section 5).

Each failure becomes a `RetrievalUnavailableError` with a short `kind`; the ones another attempt may fix
(connect, timeout, pool, 429, 5xx) are `RetryableRetrievalError`s carrying the server's Retry-After. What to do
about them (breakers, hedges, retries) is retrieval/client/client.py's job, not this module's.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

from searchrl.errors import RetrievalUnavailableError, RetryableRetrievalError
from searchrl.http import CA_BUNDLE_ENV, bearer_headers, retry_after_s
from searchrl.retrieval.client.breaker import UrlStats
from searchrl.retrieval.client.hits import Hit, parse_result


class Transport:
    """An aiohttp session with our own connection slots; built on first use in the running event loop.

    Construction does no I/O (verl builds tools in processes that never call them), and the session is
    re-created if the loop changes.
    """

    def __init__(
        self,
        *,
        api_key: str | None,
        tls: ssl.SSLContext | None,
        timeout_s: float,
        connect_timeout_s: float,
        pool_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.headers = {"Content-Type": "application/json", **bearer_headers(api_key)}
        self.tls = tls
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.pool_timeout_s = pool_timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # Our semaphore bounds connections (so pool waiting has its own deadline); the connector does not.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, ssl=self.tls if self.tls is not None else True
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

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def post(
        self, url: str, body: dict[str, Any], n_queries: int, timeout: float, st: UrlStats
    ) -> list[list[Hit]]:
        """POST /retrieve once within `timeout` (slot wait included), counting it in `st`."""
        session = self.session()
        assert self._slots is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=min(self.pool_timeout_s, timeout))
        except TimeoutError:
            raise RetryableRetrievalError(
                f"no free connection slot within {self.pool_timeout_s:g}s ({self.max_connections} in use); "
                "raise max_connections or lower concurrency",
                kind="pool",
            ) from None
        st.sent += 1
        st.outstanding += 1
        try:
            async with asyncio.timeout(timeout):
                payload = await self.exchange(session.post(url, json=body, headers=self.headers), url)
                return parse_result(payload, n_queries)
        except TimeoutError:
            raise RetryableRetrievalError(f"timeout after {timeout:.3g}s at {url}", kind="timeout") from None
        finally:
            st.outstanding -= 1
            self._slots.release()

    async def get(self, url: str) -> Any:
        """GET `url` once within `timeout_s`: its JSON body (None when it is not JSON)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.exchange(
                    self.session().get(url, headers=self.headers), url, json_only=False
                )
        except TimeoutError:
            raise RetryableRetrievalError(
                f"timeout after {self.timeout_s:g}s at {url}", kind="timeout"
            ) from None

    async def exchange(self, request: Any, url: str, *, json_only: bool = True) -> Any:
        """Send `request` (an aiohttp request context) and return the 200 answer's JSON, or raise by kind.

        `json_only`: a 200 body that is not JSON is "malformed"; otherwise it reads as None.
        """
        try:
            async with request as resp:
                status = resp.status
                if status == 200:
                    try:
                        return await resp.json(content_type=None)
                    except (ValueError, aiohttp.ContentTypeError):
                        if not json_only:
                            return None
                        raise RetrievalUnavailableError(
                            f"{url} answered 200 with a non-JSON body", kind="malformed"
                        ) from None
                message = f"{url} answered HTTP {status}: {await _detail(resp)}"
                if status == 429 or status >= 500:
                    raise RetryableRetrievalError(
                        message,
                        kind=f"http_{status}",
                        status=status,
                        retry_after=retry_after_s(resp.headers.get("Retry-After")),
                    )
                raise RetrievalUnavailableError(message, kind=f"http_{status}", status=status)
        except aiohttp.ConnectionTimeoutError:
            raise RetryableRetrievalError(
                f"cannot connect to {url} within {self.connect_timeout_s:g}s", kind="connect"
            ) from None
        except aiohttp.ServerTimeoutError:
            raise RetryableRetrievalError(
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
            raise RetryableRetrievalError(
                f"cannot connect to {url} ({type(exc).__name__})", kind="connect"
            ) from None
        except aiohttp.ClientPayloadError as exc:
            raise RetryableRetrievalError(
                f"broken response from {url} ({type(exc).__name__})", kind="connect"
            ) from None


async def _detail(resp: aiohttp.ClientResponse) -> str:
    try:
        payload = await resp.json(content_type=None)
        if isinstance(payload, dict) and "detail" in payload:
            return str(payload["detail"])[:300]
    except (ValueError, aiohttp.ContentTypeError):
        pass
    text = await resp.text()
    return text[:300] or resp.reason or "no body"


__all__ = ["Transport"]
