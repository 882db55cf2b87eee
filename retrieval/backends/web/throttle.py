"""Client-side limits on a web search provider: requests spaced in time, and a daily request budget.

Both protect the bill and the provider's own rate limit; the budget fails loudly (`QuotaExceededError`, HTTP
429 at the app) instead of running up charges.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

from searchrl.errors import QuotaExceededError


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
        return dt.datetime.fromtimestamp(self._clock(), tz=dt.UTC).date().isoformat()

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


__all__ = ["DailyBudget", "RateLimiter"]
