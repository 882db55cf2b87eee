"""The benchmark's load generators: bodies, the per-response check, and both clients against live servers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from searchrl.bench.loadgen import check_response, request_bodies
from searchrl.bench.service_load import Scenario, run_scenario
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.live import serve_in_thread
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch


def test_request_bodies_follow_the_repeat_mode() -> None:
    stream = request_bodies(["a", "b"], queries_per_request=1, repeat=3, repeat_mode="stream")
    assert [json.loads(b)["queries"] for b, _ in stream] == [["a"], ["a"], ["a"], ["b"], ["b"], ["b"]]
    per_client = request_bodies(["a", "b"], queries_per_request=1, repeat=3, repeat_mode="client")
    assert [json.loads(b)["queries"] for b, _ in per_client] == [["a"], ["b"]]  # the client repeats them
    batched = request_bodies(
        [f"q{i}" for i in range(7)], queries_per_request=3, repeat=1, repeat_mode="stream"
    )
    assert [n for _, n in batched] == [3, 3]  # the last short group is not sent
    assert json.loads(batched[0][0]) == {"queries": ["q0", "q1", "q2"], "topk": 3, "return_scores": True}


@pytest.mark.parametrize(
    ("status", "body", "expected", "kind"),
    [
        (200, b'{"result": [[], []]}', 2, None),
        (200, b'{"result": [[]]}', 2, "wrong_count"),
        (200, b'{"result": {"a": 1}}', 1, "wrong_count"),
        (200, b"<html>", 1, "bad_body"),
        (200, b'{"detail": "x"}', 1, "bad_body"),
        (503, b'{"detail": "queue full"}', 1, "http_503"),
    ],
)
def test_every_response_is_checked(status: int, body: bytes, expected: int, kind: str | None) -> None:
    assert check_response(status, body, expected) == kind


class _Misbehaving:
    """An ASGI app that answers /retrieve wrongly: 503 on odd requests, one list too many on even ones."""

    def __init__(self) -> None:
        self.n = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/health":
            status, body = 200, b'{"status": "ok"}'
        else:
            self.n += 1
            status, body = (503, b'{"detail": "busy"}') if self.n % 2 else (200, b'{"result": [[], []]}')
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.live
@pytest.mark.parametrize("client", ["raw", "aiohttp"])
def test_clients_count_non_200_and_wrong_result_counts_as_errors(client: str) -> None:
    with serve_in_thread(_Misbehaving()) as url:
        raw = _drive(url, Scenario("bad", 2, seconds=20.0, max_requests=40, client=client), ["q"] * 100)
    assert raw["requests"] == 0 and raw["queries"] == 0 and raw["latencies"] == []
    assert raw["errors"] == {"http_503": 20, "wrong_count": 20}
    assert raw["client_cpu_s"] > 0


@pytest.mark.live
@pytest.mark.parametrize("client", ["raw", "aiohttp"])
def test_clients_agree_against_the_real_service(client: str) -> None:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))
    backend = BatchedBackend(HashedFlatSearch(TINY_CORPUS), cache_size=0)
    queries = [f"Seventh Seal question number {i}" for i in range(400)]
    with serve_in_thread(create_app(settings, backend=backend)) as url:
        one = run_scenario(url, Scenario("one", 8, seconds=20.0, max_requests=120, client=client), queries)
        many = run_scenario(
            url,
            Scenario("many", 2, queries_per_request=32, seconds=20.0, max_requests=6, client=client),
            queries[200:],
        )
    assert one.client == client and one.errors == 0 and one.requests == 120 and one.queries == 120
    assert 0 < one.p50_ms <= one.p99_ms and one.client_cpu_ms_per_request > 0
    assert one.server_cpu_ms_per_request is None  # in-process server: no pid to read
    assert many.errors == 0 and many.requests == 6 and many.queries == 6 * 32


def _drive(url: str, sc: Scenario, queries: list[str]) -> dict[str, Any]:
    from searchrl.bench.loadgen import drive

    return drive(url, sc, queries)


def test_server_cpu_is_read_from_proc() -> None:
    import os
    import sys

    from searchrl.bench.procfs import process_cpu_seconds

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    sum(i * i for i in range(200_000))  # spend some CPU
    assert process_cpu_seconds(os.getpid()) > 0
    assert process_cpu_seconds(2**22 + 12345) is None  # no such process
