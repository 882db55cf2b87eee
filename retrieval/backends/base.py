"""The backend contract: what every retrieval backend (dense, bm25, web, hybrid) provides to the app."""

from __future__ import annotations

import abc
from typing import Any

from searchrl.retrieval.schemas import ScoredDocument


class Backend(abc.ABC):
    """A source of passages for queries.

    Implementations live one per file in `retrieval/backends/`, and are built from `RetrievalSettings` by
    `searchrl.retrieval.backends.build_backend`. The app calls `start()` once in its lifespan, `search()` per request
    and `close()` on shutdown.
    """

    #: short name reported by GET / ("dense", "bm25", "google", ...)
    name: str = "base"

    async def start(self) -> None:
        """Load indexes, models or clients. Heavy work belongs here, not in __init__."""

    @abc.abstractmethod
    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        """Return `topk` (or fewer) hits for each query, one list per query in order, best first.

        Must never block the event loop for model or index work (run it in a worker thread), must be safe
        to call concurrently, and must raise `searchrl.errors.BackendError` (never return empty lists)
        when it cannot answer.
        """

    def problem(self) -> str | None:
        """Why this backend cannot take traffic now (GET /ready answers 503 with it), or None when it can.

        Backends with a worker thread report a dead or stalled worker here; load goes to `busy`.
        """
        return None

    def busy(self) -> str | None:
        """Why this backend is under load (GET /ready stays 200 and says so), or None. Kept apart from
        `problem` so that a load balancer keeps a saturated replica that still computes, and drops a broken one
        even while it is also saturated."""
        return None

    def info(self) -> dict[str, Any]:
        """What GET / reports about this backend (corpus size, index type, encoder, ...)."""
        return {"backend": self.name}

    async def close(self) -> None:
        """Release resources; called once at shutdown after in-flight requests finished."""
