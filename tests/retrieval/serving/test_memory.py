"""The dense service's memory stays bounded over rounds of new queries (issue 24 item 4).

A real `searchrl serve` subprocess (dense, the bundled MiniLM, FAISS Flat over the 20-passage fixture corpus),
the result cache off, driven over loopback by the benchmark's load generator with rounds of queries it has
never seen, of every length and at 16 concurrent clients (so batches of every size). Anonymous RSS is read
from /proc/PID/smaps_rollup once each round has settled (the batcher's idle hook has run). Before issue 24
the freed buffers of every batch stayed in glibc's malloc arenas: +38 MB after the first 1,000 new queries
and +63 MB after 6,000 (measured in process, torch fp32); with the heap trimmed the process returns to its
start-up size.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from searchrl.bench.procfs import process_memory
from searchrl.bench.service import start_server, stop_server
from searchrl.bench.service_load import Scenario, run_scenario
from searchrl.retrieval.process import free_port
from tests.conftest import TINY_CORPUS

ROUNDS = 4
PER_ROUND = 400
MARGIN_MB = 25.0

# RSS bounds: read on a quiet machine, after the session's CLI runs (tests/conftest.py)
pytestmark = pytest.mark.quiet


def new_queries(n: int, seed: int) -> list[str]:
    """n distinct questions of 2..48 words from the fixture corpus's vocabulary (every token length)."""
    rows = [json.loads(line) for line in TINY_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    words = sorted({w for row in rows for w in re.findall(r"[A-Za-z]+", row["contents"])})
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add(" ".join(rng.choice(words) for _ in range(rng.randint(2, 48))) + "?")
    return sorted(out)


def settled_anon_mb(pid: int) -> float:
    time.sleep(1.5)  # past the batcher's idle_s (1 s): the burst is over and tidied up
    memory = process_memory(pid)
    assert memory is not None
    return memory["anon_mb"]


@pytest.mark.live
@pytest.mark.slow
def test_rss_is_bounded_over_rounds_of_new_queries(session_data_dir: Path, tmp_path: Path) -> None:
    env = {
        "SEARCHRL_RETRIEVAL_DATA_DIR": str(session_data_dir),
        "SEARCHRL_RETRIEVAL_CORPUS": str(TINY_CORPUS),
        "SEARCHRL_RETRIEVAL_CACHE_SIZE": "0",
        "SEARCHRL_RETRIEVAL_ENCODER_BACKEND": "torch",
        "SEARCHRL_RETRIEVAL_PRECISION": "fp32",
        "SEARCHRL_RETRIEVAL_AUTOTUNE": "false",
        "SEARCHRL_RETRIEVAL_ENCODER_WORKERS": "1",
        "SEARCHRL_LOG_LEVEL": "WARNING",
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(env, port, tmp_path / "server.log")
    try:
        warm = run_scenario(url, Scenario("warm-up", 16, seconds=120, max_requests=100), new_queries(100, 99))
        assert warm.errors == 0
        start = settled_anon_mb(proc.pid)
        anon = []
        for r in range(ROUNDS):
            queries = new_queries(PER_ROUND, r)
            res = run_scenario(url, Scenario(f"round {r}", 16, seconds=120, max_requests=PER_ROUND), queries)
            assert res.errors == 0 and res.requests == PER_ROUND and res.cache_hits == 0
            anon.append(settled_anon_mb(proc.pid))
    finally:
        stop_server(proc)
    growth = [round(a - start, 1) for a in anon]
    # bounded: after 1,600 new queries the process holds no more than a margin above its warmed-up size
    assert max(growth) < MARGIN_MB, (
        f"anonymous RSS grew {growth} MB over rounds of new queries (start {start:.0f})"
    )
