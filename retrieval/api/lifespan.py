"""The app's lifespan: build and start the backend, warm its index, watch readiness, drain and close at shutdown.

Everything it needs is on `app.state` (set by `searchrl.retrieval.serving.app.create_app`): `settings`, `metrics` and,
in tests, `backend_override`; it sets `backend` once the index is loaded and `draining` at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI

from searchrl.errors import SearchRLError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.base import Backend

log = logging.getLogger(__name__)

# Backends with a local index that a first search must page in (web backends would spend their budget).
_INDEXED_BACKENDS = frozenset({"dense", "bm25", "hybrid"})
WARM_UP_QUERY = "searchrl warm-up: who directed the seventh seal"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = app.state.settings
    be: Backend = app.state.backend_override or build_backend(settings)
    # Backends that batch (dense, bm25) report batch sizes, queue depth and cache hits to this registry.
    attach = getattr(be, "attach_metrics", None)
    try:
        await be.start()
        # not through a persistent query cache: it would store the query (record, on) or refuse it (replay)
        if settings.warm_up and settings.cache_mode == "off" and be.name in _INDEXED_BACKENDS:
            await warm_up(be, settings.topk)
    except SearchRLError as exc:
        app.state.startup_error = exc  # run_server reports it as one line (exit 2), not a traceback
        raise
    if callable(attach):  # after the warm-up: /metrics counts clients' queries only
        attach(app.state.metrics)
    app.state.backend = be
    log.info("retrieval service ready: %s", be.info())
    watchdog = asyncio.create_task(watch(app))
    try:
        yield
    finally:
        app.state.draining = True
        # uvicorn has waited for every accepted request by now; this line is what drain tests check
        log.info(
            "drained: %d /retrieve requests answered since start, %d still in flight at shutdown",
            app.state.answered,
            app.state.in_flight,
        )
        watchdog.cancel()
        with suppress(asyncio.CancelledError):
            await watchdog
        await be.close()


async def watch(app: FastAPI) -> None:
    """Watchdog: every second, check readiness; log each change once and export it as a gauge."""
    last: str | None = None
    while True:
        problem = readiness_problem(app)
        app.state.metrics.set_ready(problem is None)
        if problem != last:
            if problem is None:
                log.info("ready again")
            else:
                log.warning("not ready: %s", problem)
            last = problem
        await asyncio.sleep(1.0)


async def warm_up(be: Backend, topk: int) -> None:
    """One search through the index before uvicorn listens (the lifespan runs first), so the probe's first
    200 means a warm index: with mmap, a cold Flat index pages in all of itself on its first search, and
    that batch would outlast `worker_stall_s` and fail /ready under the first real load."""
    started = time.perf_counter()
    await be.search([WARM_UP_QUERY], topk)
    log.info("warm-up: one query through the %s index in %.1fs", be.name, time.perf_counter() - started)


def readiness_problem(app: FastAPI) -> str | None:
    """Why this replica cannot serve (None when it can); a busy replica can (`Backend.busy`)."""
    if getattr(app.state, "draining", False):
        return "draining for shutdown"
    be: Backend | None = getattr(app.state, "backend", None)
    if be is None:
        return "index not loaded yet"
    return be.problem()


__all__ = ["WARM_UP_QUERY", "lifespan", "readiness_problem"]
