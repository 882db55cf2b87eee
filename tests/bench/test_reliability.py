"""Issue 13 "must show", bounded: real `searchrl serve` processes (or the real app in uvicorn) on loopback.

The long versions are `make bench-reliability` (searchrl/bench/reliability.py); these use the same scenarios with
small sizes and assert what the issue asks: no 5xx/finding under fuzzing, big bodies refused while reading,
slow connections closed, every answer correct with none lost under load, overload, dying and hung replicas,
and SIGTERM; and issue 26's hostile pages in page mode with /health and RSS bounded.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from searchrl.bench.connections import big_body, slow_clients
from searchrl.bench.hostile_load import hostile_pages, judge_hostile
from searchrl.bench.reliability import drain, overload, replica_freeze, replica_hang, replica_kill
from searchrl.bench.reliability_load import client_call, corpus_queries, reference, run_load
from searchrl.bench.replicas import replicas
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> RetrievalSettings:
    return RetrievalSettings(
        backend="bm25", corpus=str(TINY_CORPUS), data_dir=tmp_path_factory.mktemp("data")
    )


@pytest.mark.parametrize("token", [None, "fuzz-token-5b1e"])
def test_schema_fuzzing_finds_nothing_and_the_service_stays_healthy(
    settings: RetrievalSettings, token: str | None, tmp_path: Path
) -> None:
    """schemathesis, every check, positive and negative data, against the real app in uvicorn with the
    service's own protocol settings (header deadline, connection cap); with and without auth."""
    from searchrl.retrieval.serving.app import create_app
    from searchrl.retrieval.serving.server import make_config
    from tests.live import serve_in_thread

    settings = settings.model_copy(update={"api_key": SecretStr(token) if token else None})
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    app = create_app(settings)
    cfg = make_config(app, settings)
    kwargs = {k: getattr(cfg, k) for k in ("http", "limit_concurrency", "timeout_keep_alive")}
    with serve_in_thread(app, **kwargs) as url:
        st = Path(sys.executable).with_name("st")
        auth = ["-H", f"Authorization: Bearer {token}"] if token else []
        run = subprocess.run(
            [str(st), "run", url + "/openapi.json", "--checks", "all", "--mode", "all", "-n", "60"]
            + ["--seed", "13", "--no-color", *auth],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,  # st writes a .schemathesis/ cache where it runs
        )
        assert run.returncode == 0, run.stdout[-4000:]
        assert "No issues found" in run.stdout
        assert httpx.get(url + "/ready", headers=headers).json() == {"ready": True, "detail": "ok"}
        q = {"query": "Who directed The Seventh Seal?", "topk": 1}
        r = httpx.post(url + "/retrieve", json=q, headers=headers)
        assert r.status_code == 200 and "Seventh Seal" in r.text


def test_200_mb_body_is_refused_while_reading(settings: RetrievalSettings, tmp_path: Path) -> None:
    row = big_body(settings, tmp_path, megabytes=200)
    assert row["status_line"].startswith("HTTP/1.1 413"), row
    assert row["sent_mb"] < 200  # the server stopped reading long before the end
    # memory holds at most what the guard buffers before refusing (the limit) plus allocator slack, not the body
    assert (row["rss_peak_mb"] - row["rss_before_mb"]) < row["limit_mb"] + 2, row
    assert row["health_probes"] >= 10 and row["health_max_ms"] < 100, row


def test_declared_oversize_body_is_refused_before_reading(
    settings: RetrievalSettings, tmp_path: Path
) -> None:
    import json
    import socket

    with replicas(settings, 1, tmp_path) as (r,), socket.create_connection(("127.0.0.1", r.port)) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (200 * 2**20))
        sock.settimeout(5)
        answer = sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert "SEARCHRL_RETRIEVAL_MAX_BODY_BYTES" in json.loads(body)["detail"]


def test_400_slow_connections_are_closed_by_the_server(settings: RetrievalSettings, tmp_path: Path) -> None:
    row = slow_clients(settings, tmp_path, n=400, header_timeout_s=2.0)
    assert row["closed_by_server"] == 400 and row["still_open"] == 0, row
    assert row["last_closed_s"] <= 6.0, row
    assert row["health_after"] == 200


def test_128_clients_every_answer_correct_none_lost(settings: RetrievalSettings, tmp_path: Path) -> None:
    async def go() -> tuple[object, dict]:
        from searchrl.retrieval.client import RetrievalClient

        with replicas(settings, 1, tmp_path) as (r,):
            async with RetrievalClient(r.url, max_retries=5) as client:
                call = client_call(client)
                expected = await reference(call, corpus_queries(settings, 400))
                out = await run_load(call, expected, 128, per_client=10)
                metrics = httpx.get(r.url + "/metrics").text
                return out, {"metrics": metrics, "stats": client.stats()}

    out, seen = asyncio.run(go())
    assert (out.sent, out.answered, out.wrong, out.lost) == (1280, 1280, 0, 0)  # type: ignore[attr-defined]
    # none duplicated: the server answered the reference calls plus the load once each, plus at most the hedges
    # the client sent (a duplicate the client asked for, and cancelled once the first answer came; counted)
    hedges = int(seen["stats"]["hedges"])  # type: ignore[index]
    answered = re.search(r'searchrl_retrieval_requests_total\{status="200"\} (\d+)', seen["metrics"])
    assert answered is not None and 1680 <= float(answered.group(1)) <= 1680 + hedges, (answered, hedges)


def test_overload_10x_sheds_with_retry_after_and_retries_get_everything(
    settings: RetrievalSettings, tmp_path: Path
) -> None:
    row = asyncio.run(overload(settings, tmp_path, seconds=3.0, queue=16, factor=10))
    assert row["lost"] == 0 and row["wrong"] == 0 and row["answered"] == row["sent"] > 0, row
    assert row["http_503"] > 0 and row["http_5xx"] == row["http_503"], row  # shed load, never a 500
    assert row["alive_after"] and row["ready_after"] == 200, row
    assert row["max_s"] < 60, row  # no hang


def test_replica_sigkill_through_the_verl_tool(settings: RetrievalSettings, tmp_path: Path) -> None:
    pytest.importorskip("verl")
    from searchrl.cli.reliability import tool_caller

    row = asyncio.run(replica_kill(settings, tmp_path, seconds=6.0, clients=16, make_call=tool_caller))
    assert row["lost"] == 0 and row["wrong"] == 0 and row["answered"] == row["sent"] > 0, row
    assert row["breaker_open_s"] < 1.0, row
    # closed again after the restart: the next half-open probe after the cool-down (doubled per failed probe)
    assert row["breaker_closed_after_back_s"] < 20.0, row


def test_replica_sigstop_calls_finish_within_the_deadline(
    settings: RetrievalSettings, tmp_path: Path
) -> None:
    row = asyncio.run(replica_hang(settings, tmp_path, seconds=6.0, clients=16))
    assert row["lost"] == 0 and row["wrong"] == 0, row
    assert row["max_s"] <= row["deadline_s"], row
    assert row["breaker_open_s"] < 3.0, row  # one 2 s read timeout, then the breaker skips it


def test_replica_sigstop_mid_run_costs_a_hedge_not_the_attempt_timeout(
    settings: RetrievalSettings, tmp_path: Path
) -> None:
    """Issue 26, bounded: 2 replicas, one SIGSTOPped after a fifth of the calls, client defaults (timeout_s 10 s):
    calls in flight on it are answered through hedges, none waits out the attempt timeout."""
    row = asyncio.run(replica_freeze(settings, tmp_path, calls=300, clients=16))
    assert row["lost"] == 0 and row["wrong"] == 0 and row["answered"] == row["sent"] == 300, row
    assert row["max_s"] < 5.0 and row["hedges"] > 0, row


def test_sigterm_drain_loses_no_accepted_request(settings: RetrievalSettings, tmp_path: Path) -> None:
    row = asyncio.run(drain(settings, tmp_path, seconds=4.0, clients=32))
    assert row["server_answered"] > 0 and row["in_flight_at_exit"] == 0, row
    assert row["lost"] == 0 and row["wrong"] == 0, row
    assert row["exit_signal"] == 15, row  # uvicorn re-raises SIGTERM after its graceful shutdown


def test_hostile_pages_in_flight_keep_health_and_memory_bounded(tmp_path: Path) -> None:
    """Issue 26, bounded: the real service in page mode with 8 /retrieve calls in flight for 6 s, each with a
    hostile page first (400 MiB of HTML, a gzip bomb inflating to 1 GiB, 1 byte/s, an endless redirect chain)
    and an ordinary article second. The row carries its verdict; a row that broke a bound must say so."""
    row = hostile_pages(tmp_path, seconds=6.0, page_timeout_s=2.0)
    assert row["passed"] and row["failed"] == [], row
    kinds = row["calls_by_kind"]
    assert set(kinds) == {"big", "bomb", "drip", "redirects"}, row
    assert row["sent"] == row["answered"] == sum(kinds.values()) and row["wrong"] == row["lost"] == 0, row
    # every hostile page was refused for its own reason, counted once in /metrics; the article was used
    assert row["page_failures"] == {
        "too_large": kinds["big"] + kinds["bomb"],
        "timeout": kinds["drip"],
        "redirects": kinds["redirects"],
    }, row
    assert row["ordinary_pages"] == {"ordinary": row["sent"]}, row
    assert row["health_probes"] >= 60 and row["health_errors"] == 0, row
    assert row["health_p99_ms"] < row["health_limit_ms"] == 250.0, row
    assert 0 < row["rss_base_mb"] and row["rss_growth_mb"] < row["rss_bound_mb"] == 158.5, row
    assert 1.9 < row["max_s"] < row["retrieve_limit_s"], row  # a dripping page is cut at its 2 s budget

    assert judge_hostile(row) == []
    assert judge_hostile(row, health_p99_ms=0.01) == [f"/health p99 {row['health_p99_ms']} ms >= 0.01 ms"]
    assert judge_hostile(row, rss_bound_mb=0.0) == [f"RSS grew {row['rss_growth_mb']} MB >= 0 MB"]
    assert judge_hostile({**row, "http_5xx": 2}) == ["2 5xx answers from /retrieve"]
    assert judge_hostile({**row, "wrong": 1}) == [
        "0 calls lost, 1 with hostile page text instead of the snippet"
    ]
    assert judge_hostile(row, retrieve_max_s=1.0) == [f"slowest /retrieve {row['max_s']} s >= 1 s"]
