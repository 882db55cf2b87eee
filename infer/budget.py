"""How many paid web searches an evaluation can make, and what they cost, before it starts.

    searchrl eval-budget --qa searchr1-test --limit 200 --runs 2 --price-per-1k 1.00

A web backend refuses requests past its daily budget (`SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET`), and `searchrl eval`
stops at the first refusal (quota is fatal). A budget below what the question set needs therefore stops the run
part way; the old recipe's 100/day with ~1,400 questions left the trained model's column (it runs second) nearly
all failures. The bound here is the worst case: every question uses all `max_turns` searching turns, each turn
runs `max_parallel_calls` calls of `queries_per_call` queries (each query is one upstream request; a
`query_list` of three costs three), and every query misses the cache; plus one pre-flight query per run and the
deployment's own health queries (`searchrl health` against the service sends a real search). The service
counts every upstream request against its budget, retries included, so `retry_share` adds room for them
(10% by default: a provider that needs more retries than that is down, and the run stops anyway). Prices
change: pass your plan's price per 1,000 requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SearchBudget:
    """The worst-case request count (and cost) of `runs` evaluations over `questions` questions: the inputs
    are the fields, `requests` and `cost` follow from them."""

    questions: int  # per run
    runs: int = 1  # evaluation runs that search this backend (e.g. base and trained)
    max_turns: int = 4  # searching turns per question
    max_parallel_calls: int = 1  # tool calls per turn
    queries_per_call: int = 1  # queries in one call's query_list, each one upstream request
    price_per_1k: float = 1.0  # currency units per 1,000 requests
    health_queries: int = 0  # the deployment's own health queries (real searches)
    retry_share: float = 0.0  # room for the retries the service counts against its budget

    def __post_init__(self) -> None:
        counts = (self.questions, self.runs, self.max_turns, self.max_parallel_calls, self.queries_per_call)
        if min(counts) < 1 or self.price_per_1k < 0:
            raise ValueError("questions, runs, turns, calls and queries must be >= 1 and the price >= 0")
        if self.health_queries < 0 or self.retry_share < 0:
            raise ValueError("health queries and the retry share must be >= 0")

    @property
    def requests(self) -> int:
        """Upper bound on upstream requests: pre-flight, health queries and retries included."""
        per_question = self.max_turns * self.max_parallel_calls * self.queries_per_call
        searches = self.runs * (self.questions * per_question + 1) + self.health_queries
        return math.ceil(searches * (1 + self.retry_share))

    @property
    def cost(self) -> float:
        """requests x price, upper bound, rounded up to the cent."""
        return math.ceil(self.requests * self.price_per_1k / 1000 * 100) / 100

    def describe(self) -> str:
        return (
            f"web search budget: {self.requests} requests at most ({self.runs} run(s) x {self.questions} questions "
            f"x every searching turn x {self.queries_per_call} query(ies) per call, +1 pre-flight per run, "
            f"+{self.health_queries} health queries, +{self.retry_share:.0%} for retries); at "
            f"{self.price_per_1k:.2f} per 1,000 requests that is at most {self.cost:.2f}"
        )


# the planner's name: a SearchBudget is planned by giving its inputs (a ValueError names a bad one)
plan_search_budget = SearchBudget


__all__ = ["SearchBudget", "plan_search_budget"]
