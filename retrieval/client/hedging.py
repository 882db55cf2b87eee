"""The retrieval client's hedge budget: when a duplicate request may go out, and how many (issue 26).

A hedge is due after the hedge delay: the recent `quantile` (p95) of winning attempt latencies, kept within
[`min_s`, `max_s`] (`max_s` until enough answers are seen). A token bucket caps budgeted hedges at `budget`
extra requests per call, with a burst of `BURST`; hedges forced by an opening breaker or a half-open probe
spend no token (retrieval/client/client.py decides those).
"""

from __future__ import annotations

from collections import deque

from searchrl.errors import ConfigError

#: hedges that may go out at once before the budget (`budget` tokens per call) refills
BURST = 10.0
#: winning latencies seen before the hedge delay follows them (until then it is max_s)
MIN_SAMPLES = 20


class HedgeBudget:
    """Token bucket plus hedge-delay estimate. Not thread-safe: used from one event loop."""

    def __init__(self, budget: float, quantile: float, min_s: float, max_s: float) -> None:
        if not 0.0 <= budget <= 1.0 or not 0.0 < quantile < 1.0 or min_s > max_s:
            raise ConfigError(
                f"hedging: need 0 <= hedge_budget <= 1 (got {budget}), 0 < hedge_quantile < 1 "
                f"(got {quantile}) and hedge_min_s <= hedge_max_s (got {min_s}, {max_s})"
            )
        self.budget = budget  # extra requests per call, as a fraction; 0 = no hedging
        self.quantile = quantile
        self.min_s = min_s
        self.max_s = max_s
        self.tokens = BURST
        self.denied = 0  # hedges not sent: budget spent
        self.delay_s = max_s  # until enough latencies are seen
        self._latencies: deque[float] = deque(maxlen=256)  # recent winning attempt latencies
        self._samples = 0

    def refill(self) -> None:
        """One call's share of tokens (once per call)."""
        self.tokens = min(BURST, self.tokens + self.budget)

    def take(self) -> bool:
        """Spend a token for a budgeted hedge; False (and counted as denied) when the bucket is empty."""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.denied += 1
        return False

    def give_back(self) -> None:
        """A hedge that found nowhere to go: its token is not spent."""
        self.tokens += 1.0

    def note_latency(self, seconds: float) -> None:
        self._latencies.append(seconds)
        self._samples += 1
        n = len(self._latencies)
        if n >= MIN_SAMPLES and self._samples % 16 == 0:  # not every call: it sorts 256 floats
            xs = sorted(self._latencies)
            q = xs[min(n - 1, int(self.quantile * n))]
            self.delay_s = min(self.max_s, max(self.min_s, q))


__all__ = ["HedgeBudget"]
