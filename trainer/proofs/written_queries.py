"""Would the query a model wrote have found the answer? `make learn-search`'s measure of query formulation alone.

The held-out table's answer retrieval counts a search that *ran*: a query whose call did not parse retrieves nothing,
however good. Run 9's trained model wrote the question's sentence as its query on held-out questions and then broke
every call (an extra brace, or the turn cap), so its table read 0 of 60 while its queries were good; a one-off
script found that BM25's top 3 held a golden answer for 57 of 60 of them, against 6 of 60 for the base model. This
module makes that figure part of every run's report: the first query each episode wrote after the environment's
search-call opening (trainer/proofs/search_env.py), read to its closing quote whether or not the call then parsed,
sent to the run's own retrieval service with the eval's top-k, and checked for a golden answer the way `searchrl
eval` checks its observations (infer/summary.py `answer_in_observation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from searchrl.trainer.proofs.search_env import written_query

BATCH = 16  # queries per /retrieve request


def would_retrieve(records: Sequence[Mapping[str, Any]], retrieval_url: str, topk: int) -> list[bool]:
    """Per record (`searchrl eval`'s, in order): whether its written query's top-`topk` passages from the service
    hold a golden answer; False where no query was written."""
    from searchrl.infer.summary import answer_in_observation
    from searchrl.retrieval.client import RetrievalClient

    queries = [written_query(str(r.get("response") or "")) for r in records]
    asked = [(i, q) for i, q in enumerate(queries) if q is not None]

    async def search() -> list[list[Any]]:
        async with RetrievalClient(retrieval_url) as client:
            hits: list[list[Any]] = []
            for start in range(0, len(asked), BATCH):
                hits += await client.search([q for _, q in asked[start : start + BATCH]], topk=topk)
            return hits

    found = [False] * len(records)
    for (i, _), hits in zip(asked, asyncio.run(search()) if asked else [], strict=True):
        text = "\n".join(hit.contents for hit in hits)
        found[i] = answer_in_observation(
            [{"role": "tool", "content": text}], records[i].get("golden_answers") or []
        )
    return found


__all__ = ["BATCH", "would_retrieve"]
