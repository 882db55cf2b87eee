"""`searchrl bench` plumbing: query generation, the load generator against a live server, report, CLI errors."""

from __future__ import annotations

import pytest

from retrieval.app import create_app
from retrieval.bench import QueryPool, Scenario, bench_queries, format_report, run_scenario
from retrieval.settings import RetrievalSettings
from searchrl.cli import main
from searchrl.errors import SearchRLError
from tests.conftest import DEV_QA, TINY_CORPUS
from tests.live import serve_in_thread
from tests.retrieval.batching import BatchedBackend, HashedFlatSearch


def test_bench_queries_are_distinct_and_start_with_the_qa_questions() -> None:
    queries = bench_queries(TINY_CORPUS, DEV_QA)
    assert len(queries) == len(set(queries))
    assert queries[0].startswith("Which Swedish director")  # first dev QA row
    assert len(queries) > 30 + 20  # QA questions, plus title and sentence queries from 20 passages
    assert all(len(q.split()) >= 2 for q in queries)
    pool = QueryPool(queries)
    assert pool.take(3) == queries[:3] and pool.take(2) == queries[3:5]
    with pytest.raises(SearchRLError, match="ran out of distinct queries"):
        pool.take(len(queries))


@pytest.mark.live
def test_load_generator_against_a_live_service() -> None:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))
    backend = BatchedBackend(HashedFlatSearch(TINY_CORPUS), cache_size=1000)
    queries = [f"Seventh Seal question number {i}" for i in range(400)]
    with serve_in_thread(create_app(settings, backend=backend)) as url:
        plain = run_scenario(url, Scenario("plain", 8, seconds=20.0, max_requests=120), queries[:200])
        repeated = run_scenario(
            url,
            Scenario("repeat", 4, repeat=5, repeat_mode="client", seconds=20.0, max_requests=100),
            queries[200:],
        )
    assert plain.errors == 0 and plain.requests == 120 and plain.queries == 120
    assert plain.qps > 0 and 0 < plain.p50_ms <= plain.p99_ms
    assert plain.cache_hits == 0 and plain.cache_misses == 120 and plain.mean_batch >= 1
    # each client sends its query 5 times in a row: 4 of every 5 come from the cache (the request bound may
    # cut each client's last group short)
    assert repeated.requests == 100 and repeated.cache_hits + repeated.cache_misses == 100
    assert 20 <= repeated.cache_misses <= 20 + 4


def test_report_table_and_ratios() -> None:
    row = {"precision": "fp32", "threads": 2, "forward": 32, "batch_size": 128, "qps": 300.0, "queries": 900}
    service = [
        {
            "name": n,
            "qps": q,
            "p50_ms": 10.0,
            "p99_ms": 20.0,
            "errors": 0,
            "mean_batch": 4.0,
            "cache_hits": 0,
            "cache_misses": 10,
            "dedup": 0,
        }
        for n, q in (("(b) 32 clients x 1 query", 200.0), ("(b) 128 clients x 1 query", 240.0))
    ]
    report = {
        "ceiling": [row],
        "ceiling_best": row,
        "service": service,
        "settings": {
            "SEARCHRL_RETRIEVAL_PRECISION": "fp32",
            "SEARCHRL_RETRIEVAL_THREADS": "2",
            "SEARCHRL_RETRIEVAL_BATCH_SIZE": "128",
        },
        "server_startup_s": 5.0,
        "ratios": {"b128_over_ceiling": 0.8, "c_over_b32": 4.0, "c_concurrent_over_b32": 2.5},
        "targets": {"b128 >= 70% of ceiling": True, "(c) >= 3x (b)@32": False},
        "path": "outputs/bench/x.json",
    }
    text = format_report(report)
    assert "(a) in-process fp32 2thr fwd 32 batch 128" in text
    assert "(b) 128 clients / ceiling: 80%" in text
    assert "[x] b128 >= 70% of ceiling" in text and "[ ] (c) >= 3x (b)@32" in text


def test_bench_cli_rejects_unknown_precision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--precisions", "fp32,fp64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --precisions: unknown fp64; use fp32, bf16 (CPU) or fp16 (GPU)"
