"""POST /retrieve's own handler (retrieval/serving/endpoint.py): same answers as the FastAPI route, same wire format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from searchrl.errors import BackendError
from searchrl.retrieval.schemas import Document, ScoredDocument, hits_to_payload
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.serving.endpoint import render_hits
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch
from tests.retrieval.serving.test_app import BAD_BODIES

GOOD_BODIES: list[Any] = [
    {"queries": ["Who directed The Seventh Seal?", "Bergman films"], "topk": 2, "return_scores": True},
    {"queries": ["Bergman films"], "return_scores": False},
    {"query": "Seventh Seal", "topk": 3},
]


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))
    app = create_app(settings, backend=BatchedBackend(HashedFlatSearch(TINY_CORPUS), cache_size=0))
    with TestClient(app) as c:
        yield c


def _answers(client: TestClient, bodies: list[Any]) -> list[tuple[int, str | None, bytes]]:
    out = []
    for body in bodies:
        r = client.post(
            "/retrieve", content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        out.append((r.status_code, r.headers.get("content-type"), r.content))
    r = client.post("/retrieve", content=b'{"queries": [', headers={"content-type": "application/json"})
    out.append((r.status_code, r.headers.get("content-type"), r.content))
    return out


def test_handler_and_fastapi_route_answer_byte_for_byte_alike(client: TestClient) -> None:
    bodies = GOOD_BODIES + [body for body, _, _ in BAD_BODIES]
    lane = _answers(client, bodies)
    assert client.app.retrieve_lane is not None  # type: ignore[attr-defined]
    client.app.retrieve_lane = None  # type: ignore[attr-defined]  # now FastAPI's middleware and route answer
    route = _answers(client, bodies)
    assert lane == route
    assert [status for status, _, _ in lane] == [200, 200, 200] + [s for _, s, _ in BAD_BODIES] + [400]
    assert all(ctype == "application/json" for _, ctype, _ in lane)
    assert b"not valid JSON" in lane[-1][2]


def test_get_on_retrieve_is_still_fastapis_405(client: TestClient) -> None:
    r = client.get("/retrieve")
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert r.json() == {
        "detail": 'GET /retrieve is not allowed; /retrieve answers POST with a JSON body such as {"queries": '
        '["..."], "topk": 3}'
    }
    # a 404 names the routes instead of Starlette's bare "Not Found" (docs/operations.md: one sentence, a fix)
    r = client.post("/retreive", json={"queries": ["x"]})
    assert r.status_code == 404 and r.json()["detail"].startswith(
        "no route /retreive: this service answers POST /retrieve"
    )
    r = client.post("/health")
    assert r.status_code == 405 and r.json()["detail"] == "POST /health is not allowed; /health answers GET"


def test_a_bug_in_the_handler_is_a_logged_500_not_a_dropped_connection(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backend = client.app.state.backend  # type: ignore[attr-defined]

    async def broken(queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        raise KeyError("bug")

    monkeypatch.setattr(backend, "search", broken)
    r = client.post("/retrieve", json={"queries": ["x"]})
    assert (r.status_code, r.json()) == (500, {"detail": "internal error (see server log)"})
    assert "unexpected error on /retrieve" in caplog.text and "KeyError" in caplog.text

    async def failing(queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        raise BackendError("index offline")

    monkeypatch.setattr(backend, "search", failing)
    r = client.post("/retrieve", json={"queries": ["x"]})
    assert r.status_code == 502 and r.json()["detail"] == "backend bm25 failed: index offline"
    metrics = client.get("/metrics").text
    assert 'searchrl_retrieval_errors_total{kind="internal"} 1.0' in metrics
    assert 'searchrl_retrieval_errors_total{kind="backend"} 1.0' in metrics


def test_rendering_matches_the_json_response_it_replaced() -> None:
    hits = [
        [
            ScoredDocument(
                document=Document(id="7", contents='"Ingmar Bergman"\nSwedish – director'), score=0.8312
            ),
            ScoredDocument(
                document=Document(id="12", contents='"Det sjunde inseglet"\n"quoted"'), score=-0.25
            ),
        ],
        [],
        [ScoredDocument(document=Document(id="3", contents="x", url="https://e.org"), score=0.5)],
    ]
    for scores in (True, False):
        old = json.dumps(
            hits_to_payload(hits, return_scores=scores), ensure_ascii=False, separators=(",", ":")
        ).encode()  # what Starlette's JSONResponse wrote
        assert render_hits(hits, return_scores=scores) == old
