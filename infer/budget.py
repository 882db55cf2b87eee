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
    questions: int  # per run
    runs: int  # evaluation runs that search this backend (e.g. base and trained)
    requests: int  # upper bound on upstream requests: pre-flight, health queries and retries included
    price_per_1k: float  # currency units per 1,000 requests
    cost: float  # requests x price, upper bound
    queries_per_call: int = 1
    health_queries: int = 0
    retry_share: float = 0.0

    def describe(self) -> str:
        return (
            f"web search budget: {self.requests} requests at most ({self.runs} run(s) x {self.questions} questions "
            f"x every searching turn x {self.queries_per_call} query(ies) per call, +1 pre-flight per run, "
            f"+{self.health_queries} health queries, +{self.retry_share:.0%} for retries); at "
            f"{self.price_per_1k:.2f} per 1,000 requests that is at most {self.cost:.2f}"
        )


def plan_search_budget(
    questions: int,
    *,
    runs: int = 1,
    max_turns: int = 4,
    max_parallel_calls: int = 1,
    queries_per_call: int = 1,
    price_per_1k: float = 1.0,
    health_queries: int = 0,
    retry_share: float = 0.0,
) -> SearchBudget:
    """The worst-case request count (and cost) of `runs` evaluations over `questions` questions."""
    if min(questions, runs, max_turns, max_parallel_calls, queries_per_call) < 1 or price_per_1k < 0:
        raise ValueError("questions, runs, turns, calls and queries must be >= 1 and the price >= 0")
    if health_queries < 0 or retry_share < 0:
        raise ValueError("health queries and the retry share must be >= 0")
    per_question = max_turns * max_parallel_calls * queries_per_call
    searches = runs * (questions * per_question + 1) + health_queries
    requests = math.ceil(searches * (1 + retry_share))
    cost = math.ceil(requests * price_per_1k / 1000 * 100) / 100
    return SearchBudget(
        questions, runs, requests, price_per_1k, cost, queries_per_call, health_queries, retry_share
    )


__all__ = ["SearchBudget", "plan_search_budget"]
