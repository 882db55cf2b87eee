"""Rate-limited, aggregated log lines: one line per kind of event per interval, with a count.

Why: under overload every refused request is the same event; one WARNING per 503 wrote 4,333 lines in 53 s
(issue 13) and buried everything else. `RateLimitedLog.log(key, ...)` writes the first event of a key at once,
then at most one line per `interval_s` saying how many more happened ("... (+812 more in the last 10s)").
Thread-safe: the batch worker and the event loop both report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Slot:
    last_emit: float
    suppressed: int = 0


class _Throttle:
    """Per key: let the first event through, then one per `interval_s`, counting what it held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    def admit(self, key: str) -> int | None:
        """None: hold this event back; else how many were held back since the key's last line."""
        now = self.clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None and now - slot.last_emit < self.interval_s:
                slot.suppressed += 1
                return None
            self._slots[key] = _Slot(last_emit=now)
            return slot.suppressed if slot is not None else 0


class RateLimitedLog:
    """At most one line per key per `interval_s`; suppressed events are counted into the next line."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._throttle = _Throttle(interval_s, clock)

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log `msg % args` unless `key` was logged within `interval_s`; returns whether a line was written."""
        suppressed = self._throttle.admit(key)
        if suppressed is None:
            return False
        if suppressed:
            msg = f"{msg} (+%d more like this in the last %.0fs)"
            args = (*args, suppressed, self.interval_s)
        self.logger.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, key, msg, *args)


class RateLimitFilter(logging.Filter):
    """The same aggregation for a third-party logger we cannot change (uvicorn writes one WARNING per refused
    connection: "Exceeded concurrency limit.", "Invalid HTTP request received."). Keyed by the message
    template; levels below `min_level` pass untouched."""

    def __init__(
        self,
        interval_s: float = 10.0,
        *,
        min_level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.min_level = min_level
        self._throttle = _Throttle(interval_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        suppressed = self._throttle.admit(str(record.msg))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg} (+{suppressed} more like this in the last {self.interval_s:.0f}s)"
        return True


__all__ = ["RateLimitFilter", "RateLimitedLog"]
