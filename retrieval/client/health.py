"""Is a retrieval service answering correctly? `check_health` (`searchrl health`, the launch's checks) and the
one-line summary of a RetrievalClient's counters.

A health check is a real POST /retrieve (the readiness probe SkyServe uses too), not GET /health: a service
whose index failed to load, or that wants another token, must not pass.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.retrieval.client.client import RetrievalClient
from searchrl.retrieval.client.hits import Hit

HEALTH_QUERY = "Who directed The Seventh Seal?"


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


__all__ = ["HEALTH_QUERY", "HealthResult", "check_health", "summarize_client_stats"]
