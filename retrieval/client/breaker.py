"""Per-URL circuit breaker and counters of the retrieval client (retrieval/client/client.py explains the policy).

A refused connection opens a breaker at once, `failures` consecutive faults (timeouts, 5xx, outrun by a hedge)
open it too; an open URL is skipped until its cool-down ends, then one probe goes through (half-open).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

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


@dataclass
class UrlStats:
    """Counters for one URL (see `RetrievalClient.stats`)."""

    sent: int = 0
    ok: int = 0
    outrun: int = 0  # attempts cancelled because a hedge on another connection answered first
    failed: dict[str, int] = field(default_factory=dict)  # kind -> count
    outstanding: int = 0
    last_error: str = ""


__all__ = ["CircuitBreaker", "UrlStats"]
