"""`searchrl bench` plumbing: query generation, the load generator against a live server, report, CLI errors."""

from __future__ import annotations

import pytest

from searchrl.bench.service import QueryPool, Scenario, bench_queries, format_report, run_scenario
from searchrl.cli import main
from searchrl.errors import SearchRLError
from searchrl.retrieval.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
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
    from searchrl.bench.sizing import PRICES, sizing_table

    row = {"precision": "fp32", "threads": 2, "forward": 32, "batch_size": 128, "qps": 150.0, "queries": 900}
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
        for n, q in (("(b) 32 clients x 1 query", 200.0), ("(b) 128 clients x 1 query", 330.0))
    ]
    report = {
        "ceiling": [row],
        "ceiling_best": row,
        "workers_scaling": [
            {"candidate": "onnx-int8", "workers": 1, "threads": 1, "qps": 300.0},
            {"candidate": "onnx-int8", "workers": 2, "threads": 1, "qps": 560.0},
        ],
        "service": service,
        "settings": {"SEARCHRL_RETRIEVAL_BATCH_SIZE": "128"},
        "encoder": {
            "encoder_backend": "onnx",
            "precision": "int8",
            "encoder_workers": 2,
            "threads_per_worker": 1,
            "forward_batch_size": 32,
        },
        "encoder_tuning": {
            "qps": 600.0,
            "seconds": 9.0,
            "gate_queries": 400,
            "candidates": [
                {"name": "torch-fp32", "recall@3": 1.0, "qps": 150.0, "status": "ok"},
                {"name": "onnx-int8", "recall@3": 0.995, "qps": 600.0, "status": "ok"},
                {"name": "onnx-fp32", "recall@3": None, "qps": None, "status": "refused: could not build"},
            ],
        },
        "machine": {"cpu": "AMD EPYC", "cpus": 2, "fast_bf16": True, "loadavg_1m_before": 0.2},
        "server_startup_s": 5.0,
        "ratios": {
            "b128_over_ceiling": 2.2,
            "b128_p99_over_queueing_bound": 1.1,
            "c_over_b32": 4.0,
            "c_concurrent_over_b32": 2.5,
        },
        "targets": {"b128 >= 2x fp32 in-process ceiling": True, "(c) >= 3x (b)@32": False},
        "sizing": sizing_table({"minilm onnx-int8": 330.0}, cores=2, price=PRICES["c7a.large"], gpus=(8,)),
        "path": "outputs/bench/x.json",
    }
    text = format_report(report)
    assert "(a) in-process fp32 2thr fwd 32 batch 128" in text
    assert "(a') in-process onnx-int8 2 workers x 1thr" in text
    assert "(b) 128 clients / fp32 ceiling: 2.20x   (target >= 2x)" in text
    assert "p99 / (128 / q/s): 1.10x   (target <= 1.3x)" in text
    assert "no cache hits" in text and "AMD EPYC, 2 cores" in text
    assert "onnx-int8  recall@3  0.995    600 q/s  ok" in text
    assert "onnx-fp32  recall@3      -          -  refused: could not build" in text
    assert "[x] b128 >= 2x fp32 in-process ceiling" in text and "[ ] (c) >= 3x (b)@32" in text
    assert "c7a.large $0.1026/h" in text


def test_bench_cli_rejects_unknown_precision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--precisions", "fp32,fp64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --precisions: unknown fp64; use fp32, bf16 (CPU) or fp16 (GPU)"
