"""HTTP plumbing every searchrl client shares: TLS trust, the bearer header, retries, readiness polls and
`async with` closing.

Three clients talk HTTP with retries: the retrieval client (retrieval/client/client.py, aiohttp), the web search
providers (retrieval/backends/web/, httpx) and the LLM client (infer/llm.py, httpx). They used to carry three
back-off loops, and only one of them read an HTTP-date Retry-After. Here is the one policy, on tenacity:

- an attempt that another attempt may fix raises `RetryableError` (searchrl/errors.py), with the server's
  Retry-After in seconds when it sent one (`retry_after_s` reads both forms of RFC 9110 section 10.2.3);
- `retrying()` retries exactly those, waiting a jittered exponential back-off or the Retry-After if longer
  (capped), and, given a deadline, never starts a wait that would end past it.

Bottom layer: imports nothing from retrieval/, trainer/, infer/, cli/ or deploy/, and nothing heavy at import.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Self

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_before_delay,
    wait_fixed,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from searchrl.errors import ConfigError, RetryableError

log = logging.getLogger(__name__)

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


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>`, or no header without a key (the service then answers 401 if it wants one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def retry_after_s(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """A Retry-After header in seconds from now: delay-seconds or an HTTP-date; None when absent or unreadable."""
    if not value or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now())
    except (TypeError, ValueError, IndexError):
        return None


def backoff_s(attempt: int, *, base_s: float, max_s: float, jitter: float = 0.5) -> float:
    """The wait before retry `attempt` (0-based): base_s * 2**attempt, capped at max_s, minus up to `jitter` of it.

    Jitter spreads the retries of clients that failed together. jitter=0.5 waits between half and all of the
    cap; jitter=1 is "full jitter" (anywhere from 0), which the retrieval client uses: its calls are many and
    short, and spreading them matters more than a minimum pause.
    """
    cap = min(max_s, base_s * 2**attempt)
    return float(cap * (1.0 - jitter * random.random()))


class wait_backoff(wait_base):  # noqa: N801 (tenacity's wait strategies are lower-case)
    """tenacity wait: `backoff_s`, or the failed attempt's `retry_after` (capped) when that is longer."""

    def __init__(
        self, base_s: float, max_s: float, *, jitter: float = 0.5, retry_after_max_s: float | None = None
    ) -> None:
        self.base_s, self.max_s, self.jitter = base_s, max_s, jitter
        self.retry_after_max_s = max_s if retry_after_max_s is None else retry_after_max_s

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = backoff_s(
            retry_state.attempt_number - 1, base_s=self.base_s, max_s=self.max_s, jitter=self.jitter
        )
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, min(float(retry_after), self.retry_after_max_s))
        return delay


def retrying(
    *,
    attempts: int,
    base_s: float,
    max_s: float,
    jitter: float = 0.5,
    retry_after_max_s: float | None = None,
    deadline_s: float | None = None,
    before_sleep: Callable[[RetryCallState], Any] | None = None,
) -> AsyncRetrying:
    """`async for attempt in retrying(...): with attempt: ...`: up to `attempts` tries of what raises
    `RetryableError`; the last one re-raises it (`reraise`), anything else propagates at once.

    `deadline_s`: never start a wait (back-off or Retry-After) that ends more than this after the first try.
    """
    stop: stop_base = stop_after_attempt(attempts)
    if deadline_s is not None:
        stop = stop | stop_before_delay(deadline_s)
    return AsyncRetrying(
        retry=retry_if_exception_type(RetryableError),
        stop=stop,
        wait=wait_backoff(base_s, max_s, jitter=jitter, retry_after_max_s=retry_after_max_s),
        before_sleep=before_sleep,
        reraise=True,
    )


def http_ok(url: str, *, method: str = "GET", timeout_s: float = 2.0, **kwargs: Any) -> bool:
    """Whether one request to `url` answers 200: a readiness probe for `wait_until_ready` (`kwargs` go to httpx,
    e.g. json= and headers= for a real POST /retrieve). Connection errors propagate, as "not ready yet"."""
    import httpx

    return httpx.request(method, url, timeout=timeout_s, **kwargs).status_code == 200


def wait_until_ready(
    probe: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.2,
    not_ready: tuple[type[BaseException], ...] | None = None,
) -> bool:
    """Call `probe` every `interval_s` until it returns True (ready: True) or `timeout_s` passes (False).

    An exception of a `not_ready` type (default: OSError and httpx.HTTPError, what a server that is still
    starting answers with) counts as not ready yet; any other propagates, so a probe can end the wait early,
    e.g. by raising when the server's process has exited. The caller words the timeout: it knows what it waited for.
    """
    if not_ready is None:
        import httpx

        not_ready = (OSError, httpx.HTTPError)
    retryer = Retrying(
        retry=retry_if_result(lambda ready: not ready) | retry_if_exception_type(not_ready),
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry_error_callback=lambda state: False,
    )
    return bool(retryer(probe))


class AsyncClosing:
    """`async with Client(...) as client:` for a client that holds connections: the block's end awaits the
    client's `aclose()`, which each client defines (the retrieval client's aiohttp sessions, the LLM client's httpx
    pool)."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = [
    "AsyncClosing",
    "CA_BUNDLE_ENV",
    "backoff_s",
    "bearer_headers",
    "http_ok",
    "retry_after_s",
    "retrying",
    "tls_context",
    "wait_backoff",
    "wait_until_ready",
]
