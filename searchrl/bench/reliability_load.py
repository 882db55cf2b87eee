"""Client-side load for the reliability scenarios: distinct queries, their expected answers, concurrent callers
that check every answer, and what they saw (`Outcome`).

Each query's expected passage ids come from one sequential call before any load, with the replicas' result
cache off, so a correct answer under load means the right work was done for that query.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchrl.errors import RetrievalUnavailableError
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.settings import RetrievalSettings

#: call(query) -> an answer that can be compared with the reference (passage ids, or an observation text)
Call = Callable[[str], Awaitable[Any]]


def corpus_queries(settings: RetrievalSettings, n: int) -> list[str]:
    """`n` distinct queries made from the corpus titles (title + a rotating question frame)."""
    from searchrl.prompt import split_title
    from searchrl.retrieval.index.build import resolve_corpus

    titles: list[str] = []
    with open(resolve_corpus(settings), encoding="utf-8") as f:
        for line in f:
            titles.append(split_title(json.loads(line)["contents"])[0])
    frames = ["{}", "who or what is {}", "history of {}", "facts about {}", "{} explained", "where is {}"]
    out: list[str] = []
    i = 0
    while len(out) < n:
        out.append(frames[(i // len(titles)) % len(frames)].format(titles[i % len(titles)]) + f" {i}")
        i += 1
    return out


def client_call(client: RetrievalClient, topk: int = 3) -> Call:
    async def call(query: str) -> list[str]:
        return [h.id for h in (await client.search([query], topk))[0]]

    return call


async def reference(call: Call, queries: Sequence[str]) -> dict[str, Any]:
    """Expected answer per query: one call each, sequential, before any load or fault."""
    return {q: await call(q) for q in queries}


@dataclass
class Outcome:
    """What a load run saw, client side."""

    sent: int = 0
    answered: int = 0
    wrong: int = 0
    lost: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def p(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def row(self, **extra: Any) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "wrong": self.wrong,
            "lost": self.lost,
            "p50_s": round(self.p(0.50), 3),
            "p99_s": round(self.p(0.99), 3),
            "max_s": round(max(self.latencies, default=0.0), 3),
            "errors": dict(self.errors),
            **extra,
        }


async def run_load(
    call: Call,
    expected: dict[str, Any],
    clients: int,
    *,
    seconds: float | None = None,
    per_client: int | None = None,
    total: int | None = None,
    until: asyncio.Event | None = None,
) -> Outcome:
    """`clients` concurrent loops over the query pool (each client its own offset), for `seconds`, or
    `per_client` calls each, or `total` calls in all (and, with `until`, at least until it is set). Every
    answer is compared with `expected`."""
    pool = list(expected)
    out = Outcome()
    stop_at = time.monotonic() + seconds if seconds is not None else None

    def more(n: int) -> bool:
        if until is not None and not until.is_set():
            return True
        return (
            (per_client is None or n < per_client)
            and (total is None or out.sent < total)
            and (stop_at is None or time.monotonic() < stop_at)
        )

    async def worker(w: int) -> None:
        i = w
        n = 0
        while more(n):
            q = pool[i % len(pool)]
            i += clients
            n += 1
            out.sent += 1
            started = time.monotonic()
            try:
                got = await call(q)
            except RetrievalUnavailableError as exc:
                out.lost += 1
                out.errors[exc.kind] += 1
                continue
            out.latencies.append(time.monotonic() - started)
            if got == expected[q]:
                out.answered += 1
            else:
                out.wrong += 1

    await asyncio.gather(*(worker(w) for w in range(clients)))
    return out


def server_5xx(stats: dict[str, Any]) -> int:
    """5xx answers the client saw (retried ones included), from RetrievalClient.stats()."""
    return sum(
        n for u in stats["urls"].values() for kind, n in u["failed"].items() if kind.startswith("http_5")
    )


__all__ = ["Call", "Outcome", "client_call", "corpus_queries", "reference", "run_load", "server_5xx"]
