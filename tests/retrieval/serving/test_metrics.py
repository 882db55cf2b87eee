"""GET /metrics: Prometheus text with request, query, error, latency, batch, queue and cache metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.serving.metrics import RetrievalMetrics
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch

SEAL_Q = "Who directed The Seventh Seal?"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_queries_batches_cache_and_errors() -> None:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS), max_topk=10)
    backend = BatchedBackend(HashedFlatSearch(TINY_CORPUS), batch_wait_ms=1)
    with TestClient(create_app(settings, backend=backend)) as client:
        for body in (
            {"queries": [SEAL_Q, "Forbidden City"], "topk": 3},
            {"query": SEAL_Q, "topk": 2},  # served by the cache (computed with topk 3)
            {"queries": ["Rashi"], "topk": 11},  # above max_topk: 422
        ):
            client.post("/retrieve", json=body)
        client.post("/retrieve", content=b"{not json", headers={"content-type": "application/json"})
        r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert value(text, "searchrl_retrieval_requests_total", status="200") == 2
    assert value(text, "searchrl_retrieval_requests_total", status="422") == 1
    assert value(text, "searchrl_retrieval_requests_total", status="400") == 1
    assert value(text, "searchrl_retrieval_errors_total", kind="invalid") == 2
    assert (
        value(text, "searchrl_retrieval_queries_total") == 3
    )  # 2 + 1; a body the schema refuses counts none
    assert value(text, "searchrl_retrieval_request_seconds_count") == 4
    assert value(text, "searchrl_retrieval_cache_hits_total") == 1
    assert value(text, "searchrl_retrieval_cache_misses_total") == 2
    assert value(text, "searchrl_retrieval_batch_size_count") == 1  # both misses in one batch
    assert value(text, "searchrl_retrieval_batch_size_sum") == 2
    assert value(text, "searchrl_retrieval_queue_wait_seconds_count") == 2
    assert value(text, "searchrl_retrieval_queue_depth") == 0
    assert backend.closed


def test_metrics_need_the_bearer_token_like_retrieve() -> None:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS), api_key="s3cret-token")
    backend = BatchedBackend(HashedFlatSearch(TINY_CORPUS))
    with TestClient(create_app(settings, backend=backend)) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.post("/retrieve", json={"query": SEAL_Q}).status_code == 401
        r = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert r.status_code == 200
    assert value(r.text, "searchrl_retrieval_errors_total", kind="auth") == 1
    assert "s3cret-token" not in r.text


def test_each_app_has_its_own_registry() -> None:
    a, b = RetrievalMetrics(), RetrievalMetrics()  # would raise "Duplicated timeseries" on a shared one
    a.observe_request(200, 3, 0.01)
    assert value(a.render().decode(), "searchrl_retrieval_queries_total") == 3
    assert value(b.render().decode(), "searchrl_retrieval_queries_total") == 0
