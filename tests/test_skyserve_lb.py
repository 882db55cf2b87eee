"""SkyServe 0.14.1's load balancer sends at most 100 requests at a time to one replica (issue 21 item 10).

Its proxy keeps one `httpx.AsyncClient(base_url=replica_url)` per replica (sky/serve/load_balancer.py
`_sync_with_controller_once`) with httpx's default `Limits(max_connections=100)`, and the service spec has no
knob for it (`load_balancer:` takes only `stream_timeout_seconds`, sky/utils/schemas.py). Requests past 100 wait
inside the load balancer for a free connection. Measured here with SkyServe's own load balancer
(tests/skyserve_lb.py) in front of the real service, whose batch worker is held so requests pile up.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from searchrl.retrieval.app import create_app
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.live import serve_in_thread
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch
from tests.skyserve_lb import skyserve_load_balancer

pytestmark = pytest.mark.live

SKYSERVE_PER_REPLICA = 100  # httpx.Limits().max_connections
CALLS = 150  # more than one replica's share; the trainer has up to train_batch_size x rollout_n (2,560)


def test_skyserves_load_balancer_holds_one_replica_to_100_requests_in_flight() -> None:
    fn = HashedFlatSearch(TINY_CORPUS)
    fn.gate.clear()  # the worker holds its first batch: every request that reaches the replica stays in flight
    backend = BatchedBackend(fn, batch_size=256, batch_wait_ms=0, cache_size=0, request_timeout_s=120)
    app = create_app(RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS)), backend=backend)
    results: list[Any] = []

    async def calls(url: str) -> None:
        async with RetrievalClient(
            url, timeout_s=90, max_retries=0, hedge_budget=0, max_connections=256
        ) as c:
            results.extend(
                await asyncio.gather(
                    *(c.search([f"Seventh Seal question {i}"], 2) for i in range(CALLS)),
                    return_exceptions=True,
                )
            )

    with serve_in_thread(app) as replica, skyserve_load_balancer([replica]) as lb:
        sender = threading.Thread(target=asyncio.run, args=(calls(lb),))
        sender.start()
        deadline = time.monotonic() + 60
        while app.state.in_flight < SKYSERVE_PER_REPLICA:
            assert time.monotonic() < deadline, f"only {app.state.in_flight} requests reached the replica"
            time.sleep(0.05)
        time.sleep(2.0)  # the other 50 have had time to arrive, if the load balancer let them
        at_replica = app.state.in_flight
        fn.gate.set()
        sender.join(timeout=120)
    assert at_replica == SKYSERVE_PER_REPLICA, at_replica  # 150 sent, 100 at the replica, 50 in the balancer
    assert len(results) == CALLS and not [r for r in results if isinstance(r, BaseException)]  # all answered
