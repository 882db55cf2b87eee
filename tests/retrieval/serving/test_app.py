"""The /retrieve contract, bad input and auth, against a real uvicorn server on a loopback port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from searchrl.errors import ConfigError
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.serving.server import check_bind
from searchrl.retrieval.settings import RetrievalSettings
from tests.live import serve_in_thread

pytestmark = pytest.mark.live

SEAL_Q = "Who directed The Seventh Seal?"


def _post(url: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(url + "/retrieve", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def _titles(docs: list[dict]) -> list[str]:
    return [d["contents"].split("\n", 1)[0].strip('"') for d in docs]


def test_batch_body_with_scores(live_bm25_url: str) -> None:
    r = _post(live_bm25_url, {"queries": [SEAL_Q], "topk": 3, "return_scores": True})
    assert r.status_code == 200
    (hits,) = r.json()["result"]
    assert len(hits) == 3
    assert set(hits[0]) == {"document", "score"}
    assert set(hits[0]["document"]) >= {"id", "contents"}
    assert _titles([h["document"] for h in hits])[0] == "The Seventh Seal"
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_return_scores_false_gives_bare_documents_for_any_batch_size(live_bm25_url: str) -> None:
    # Upstream's server answers 500 here for most batch sizes (DESIGN.md section 2).
    for n in (1, 2, 5, 7):
        r = _post(live_bm25_url, {"queries": [SEAL_Q] * n, "topk": 2, "return_scores": False})
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        assert len(result) == n
        for docs in result:
            assert len(docs) == 2
            assert set(docs[0]) >= {"id", "contents"} and "score" not in docs[0]


def test_default_return_scores_is_false(live_bm25_url: str) -> None:
    r = _post(live_bm25_url, {"queries": [SEAL_Q]})
    assert r.status_code == 200
    assert "document" not in r.json()["result"][0][0]


def test_skyrl_single_query_body(live_bm25_url: str) -> None:
    r = _post(live_bm25_url, {"query": SEAL_Q, "topk": 2, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 1 and len(result[0]) == 2
    assert _titles([h["document"] for h in result[0]])[0] == "The Seventh Seal"


def test_results_follow_query_order(live_bm25_url: str) -> None:
    queries = [SEAL_Q, "Rashi commentary on the Talmud", "Forbidden City Beijing palace", "platypus mammal"]
    batch = _post(live_bm25_url, {"queries": queries, "topk": 3, "return_scores": True}).json()["result"]
    assert len(batch) == len(queries)
    for q, got in zip(queries, batch, strict=True):
        alone = _post(live_bm25_url, {"queries": [q], "topk": 3, "return_scores": True}).json()["result"][0]
        assert [h["document"]["id"] for h in got] == [h["document"]["id"] for h in alone]
    assert _titles([h["document"] for h in batch[1]])[0] == "Rashi"
    assert _titles([h["document"] for h in batch[2]])[0] == "Forbidden City"


def test_topk_defaults_to_server_setting_and_is_honoured(live_bm25_url: str) -> None:
    r = _post(live_bm25_url, {"queries": [SEAL_Q]})
    assert len(r.json()["result"][0]) == 3  # RetrievalSettings.topk default
    for k in (1, 5, 20):
        r = _post(live_bm25_url, {"queries": [SEAL_Q], "topk": k})
        assert len(r.json()["result"][0]) == k  # the fixture corpus has 20 passages


def test_health_and_describe(live_bm25_url: str) -> None:
    assert httpx.get(live_bm25_url + "/health").json() == {"status": "ok"}
    info = httpx.get(live_bm25_url + "/").json()
    assert info["backend"] == "bm25"
    assert info["corpus_size"] == 20
    assert info["version"]


BAD_BODIES = [
    ({}, 422, "queries"),
    ({"queries": []}, 422, "empty"),
    ({"queries": ["ok", 3]}, 422, "queries.1"),
    ({"queries": "not a list"}, 422, "queries"),
    ({"queries": ["a"], "topk": 0}, 422, "topk"),
    ({"queries": ["a"], "topk": -2}, 422, "topk"),
    ({"queries": ["a"], "topk": 51}, 422, "maximum of 50"),
    ({"queries": ["a"], "topk": "3"}, 422, "topk"),
    ({"queries": ["a"] * 257}, 422, "at most 256"),
    ({"queries": ["x" * 2049]}, 422, "maximum is 2048"),
    ({"queries": ["   "]}, 422, "empty query"),
    ({"queries": ["a"], "topK": 3}, 422, "unknown field 'topK'"),
    ({"queries": ["a"], "query": "b"}, 422, "not both"),
    ({"queries": ["a"], "return_scores": "yes"}, 422, "return_scores"),
    ([1, 2], 422, "JSON object"),
]


@pytest.mark.parametrize(("body", "status", "needle"), BAD_BODIES)
def test_bad_input_gets_a_clear_4xx(live_bm25_url: str, body: object, status: int, needle: str) -> None:
    r = _post(live_bm25_url, body)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and needle in detail, detail
    assert "Traceback" not in r.text


def test_malformed_json_is_a_400(live_bm25_url: str) -> None:
    r = httpx.post(
        live_bm25_url + "/retrieve", content=b'{"queries": [', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["detail"]


def test_server_still_answers_after_bad_input(live_bm25_url: str) -> None:
    for body, _, _ in BAD_BODIES:
        _post(live_bm25_url, body)
    assert _post(live_bm25_url, {"queries": [SEAL_Q]}).status_code == 200


# --- auth ----------------------------------------------------------------------------------------------------

KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def keyed_url(bm25_settings: RetrievalSettings) -> Iterator[str]:
    settings = RetrievalSettings(**{**bm25_settings.model_dump(), "api_key": KEY})
    with serve_in_thread(create_app(settings)) as url:
        yield url


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {KEY}"}, 401),
        ({"Authorization": f"Bearer {KEY}"}, 200),
    ],
)
def test_bearer_auth(keyed_url: str, headers: dict[str, str], status: int) -> None:
    r = _post(keyed_url, {"queries": [SEAL_Q]}, headers=headers)
    assert r.status_code == status
    if status == 401:
        assert "RETRIEVAL_API_KEY" in r.json()["detail"]
        assert KEY not in r.text
    info = httpx.get(keyed_url + "/", headers=headers)
    assert info.status_code == status


def test_health_needs_no_key(keyed_url: str) -> None:
    assert httpx.get(keyed_url + "/health").status_code == 200


def test_public_bind_without_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="RETRIEVAL_API_KEY"):
        check_bind(RetrievalSettings(host="0.0.0.0"))
    check_bind(RetrievalSettings(host="0.0.0.0", insecure=True))
    check_bind(RetrievalSettings(host="0.0.0.0", api_key=KEY))
    check_bind(RetrievalSettings(host="127.0.0.1"))


def test_cli_public_bind_refused_with_one_line_and_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "searchrl", "serve", "--host", "0.0.0.0", "--backend", "bm25"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refusing to listen on 0.0.0.0"), proc.stderr


def test_cli_bad_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "searchrl", "serve", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "port" in proc.stderr and "SEARCHRL_RETRIEVAL_PORT" in proc.stderr
