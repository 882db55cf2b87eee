"""Reliability benchmark (issue 13): real `searchrl serve` processes on loopback, under faults.

    searchrl reliability                          # make bench-reliability: every scenario, default sizes
    searchrl reliability --seconds 60 --only soak,kill

Scenarios (each returns one row of the table in docs/operations.md):
    soak        C clients x unique queries for S seconds: every answer checked, RSS after warm-up vs end
    overload    10 x the queue bound in concurrent clients: 503 + Retry-After, never a hang; retries get all
    kill        3 replicas, SIGKILL one mid-run, restart it: breaker open/close times, no call lost
    hang        3 replicas, SIGSTOP one mid-run (a hung replica), SIGCONT later: calls finish in the deadline
    freeze      2 replicas, 1,500 calls, SIGSTOP one after a fifth (issue 26), client defaults: p99/max, hedges
    drain       SIGTERM one replica under load: no accepted request lost, exit code 0
    big-body    a 200 MB chunked body: refused while reading; RSS rise and /health latency meanwhile
    slow        400 connections trickling a byte a second: closed by the header/body deadlines
    hostile     page mode (issue 26): 8 /retrieve calls in flight for 25 s, each with a hostile result page
                (400 MiB, a 1 GiB gzip bomb, 1 byte/s, a redirect loop) and an ordinary one: /health p99, RSS
                growth (from /proc), page failures by reason; the row says whether the bounds held

Not in the service modules on purpose: this is a load generator, it imports the client and starts processes.
Correctness: each query's expected passage ids come from one sequential call before any load, with the
replicas' result cache off, so a correct answer under load means the right work was done for that query.
The tests in tests/bench/test_reliability.py run the same scenarios with small sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from searchrl.bench.connections import big_body, slow_clients
from searchrl.bench.hostile_load import hostile_pages
from searchrl.bench.reliability_load import (
    Call,
    Outcome,
    client_call,
    corpus_queries,
    reference,
    run_load,
    server_5xx,
)
from searchrl.bench.replicas import replicas
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.settings import RetrievalSettings

# --- scenarios ---------------------------------------------------------------------------------------------

#: what `run_all`'s make_call builds for a list of URLs: call(query), its client's stats, and close
MakeCall = Callable[[list[str]], tuple[Call, Callable[[], dict[str, Any]], Callable[[], Awaitable[None]]]]


@contextlib.asynccontextmanager
async def _caller(
    urls: list[str], make_call: MakeCall | None, **client_kwargs: Any
) -> AsyncIterator[tuple[Call, Callable[[], dict[str, Any]]]]:
    """call(query) and its client's stats for the replica scenarios: through `make_call` (the verl SearchTool, as
    rollouts call) or else a RetrievalClient over `urls` with `client_kwargs`; closed when the block ends."""
    close: Callable[[], Awaitable[None]]
    if make_call is None:
        client = RetrievalClient(urls, **client_kwargs)
        call, stats, close = client_call(client), client.stats, client.aclose
    else:
        call, stats, close = make_call(urls)
    try:
        yield call, stats
    finally:
        await close()


async def soak(
    settings: RetrievalSettings, workdir: Path, *, seconds: float, clients: int = 128
) -> dict[str, Any]:
    with replicas(settings, 1, workdir / "soak") as (r,):
        async with RetrievalClient(r.url, timeout_s=10, max_retries=5) as client:
            call = client_call(client)
            expected = await reference(call, corpus_queries(settings, 2000))
            warm = await run_load(call, expected, clients, seconds=max(5.0, seconds * 0.1))
            rss_warm = r.rss()
            out = await run_load(call, expected, clients, seconds=seconds)
            rss_end = r.rss()
            stats = client.stats()
    out.sent += warm.sent
    out.answered += warm.answered
    out.wrong += warm.wrong
    out.lost += warm.lost
    return out.row(
        scenario=f"soak {seconds:g}s, {clients} clients",
        http_5xx=server_5xx(stats),
        rss_warm_mb=round(rss_warm / 2**20, 1),
        rss_end_mb=round(rss_end / 2**20, 1),
    )


async def overload(
    settings: RetrievalSettings, workdir: Path, *, seconds: float, queue: int = 16, factor: int = 10
) -> dict[str, Any]:
    """Offered concurrency = factor x the queue bound (each client keeps one unique query in flight)."""
    env = {
        "SEARCHRL_RETRIEVAL_QUEUE_SIZE": str(queue),
        "SEARCHRL_RETRIEVAL_BATCH_SIZE": str(max(1, queue // 2)),
    }
    with replicas(settings, 1, workdir / "overload", env) as (r,):
        async with RetrievalClient(
            r.url,
            timeout_s=10,
            max_retries=1000,
            deadline_s=seconds + 60,
            backoff_base_s=0.05,
            backoff_max_s=1.0,
        ) as client:
            call = client_call(client)
            expected = await reference(call, corpus_queries(settings, queue * factor * 4))
            out = await run_load(call, expected, queue * factor, seconds=seconds)
            stats = client.stats()
            alive = r.proc is not None and r.proc.poll() is None
            ready = httpx.get(r.url + "/ready", timeout=5).status_code
    return out.row(
        scenario=f"overload {factor}x queue ({queue * factor} clients, queue {queue})",
        http_5xx=server_5xx(stats),
        http_503=sum(u["failed"].get("http_503", 0) for u in stats["urls"].values()),
        retries=stats["retries"],
        alive_after=alive,
        ready_after=ready,
    )


async def _with_fault(
    settings: RetrievalSettings,
    workdir: Path,
    *,
    seconds: float,
    clients: int,
    fault: str,
    make_call: MakeCall | None,
    timeout_s: float,
) -> dict[str, Any]:
    """3 replicas; at 1/3 of the run SIGKILL (or SIGSTOP) replica 0; at 2/3 restart (or SIGCONT) it."""
    with replicas(settings, 3, workdir / fault) as reps:
        urls = [r.url for r in reps]
        client_kwargs: dict[str, Any] = {"timeout_s": timeout_s, "max_retries": 3, "breaker_reset_s": 0.5}
        async with _caller(urls, make_call, **client_kwargs) as (call, stats):
            expected = await reference(call, corpus_queries(settings, 600))
            target = urls[0]
            times: dict[str, float] = {}

            def breaker() -> str:
                return str(stats()["urls"][target]["breaker"])

            async def inject() -> None:
                await asyncio.sleep(seconds / 3)
                times["fault"] = time.monotonic()
                reps[0].signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                while breaker() == "closed" and time.monotonic() - times["fault"] < seconds:
                    await asyncio.sleep(0.005)
                times["opened"] = time.monotonic()
                await asyncio.sleep(
                    max(0.0, seconds * 2 / 3 - (time.monotonic() - times["fault"]) - seconds / 3)
                )
                if fault == "kill":
                    await asyncio.to_thread(reps[0].start)
                else:
                    reps[0].signal(signal.SIGCONT)
                times["back"] = time.monotonic()
                # calls keep going until the breaker closed (a probe needs traffic), at most 60 s more
                while breaker() != "closed" and time.monotonic() - times["back"] < 60:
                    await asyncio.sleep(0.005)
                times["closed"] = time.monotonic()
                recovered.set()

            recovered = asyncio.Event()
            injector = asyncio.create_task(inject())
            out = await run_load(call, expected, clients, seconds=seconds, until=recovered)
            await injector
            st = stats()
    return out.row(
        scenario=f"replica {'SIGKILL' if fault == 'kill' else 'SIGSTOP'} (3 replicas, {clients} clients)",
        http_5xx=server_5xx(st),
        breaker_open_s=round(times["opened"] - times["fault"], 3),
        breaker_closed_after_back_s=round(times["closed"] - times["back"], 3),
        deadline_s=timeout_s * 4,
        hedges=st.get("hedges", 0),
    )


async def replica_kill(
    settings: RetrievalSettings, workdir: Path, *, seconds: float, clients: int = 32, make_call: Any = None
) -> dict[str, Any]:
    return await _with_fault(
        settings, workdir, seconds=seconds, clients=clients, fault="kill", make_call=make_call, timeout_s=10
    )


async def replica_hang(
    settings: RetrievalSettings, workdir: Path, *, seconds: float, clients: int = 32, make_call: Any = None
) -> dict[str, Any]:
    return await _with_fault(
        settings, workdir, seconds=seconds, clients=clients, fault="hang", make_call=make_call, timeout_s=2
    )


async def replica_freeze(
    settings: RetrievalSettings,
    workdir: Path,
    *,
    calls: int = 1500,
    clients: int = 32,
    make_call: Any = None,
) -> dict[str, Any]:
    """Issue 26: 2 replicas, `clients` concurrent callers, `calls` calls in all, replica 0 SIGSTOPped once a fifth
    of the calls have finished and never resumed, through `RetrievalClient` with the defaults users get (or
    `make_call`). Without hedging every call in flight on the frozen replica waits out `timeout_s` (10 s)."""
    with replicas(settings, 2, workdir / "freeze") as reps:
        urls = [r.url for r in reps]
        async with _caller(urls, make_call) as (call, stats):
            expected = await reference(call, corpus_queries(settings, 600))
            base = stats()
            finished = 0
            frozen_at = asyncio.Event()

            async def counted(query: str) -> Any:
                nonlocal finished
                try:
                    return await call(query)
                finally:
                    finished += 1
                    if finished >= calls // 5 and not frozen_at.is_set():
                        reps[0].signal(signal.SIGSTOP)  # mid-run: calls are in flight on it now
                        frozen_at.set()

            out = await run_load(counted, expected, clients, total=calls)
            st = stats()
    return out.row(
        scenario=f"SIGSTOP 1 of 2 replicas after 1/5 of {calls} calls ({clients} clients, client defaults)",
        http_5xx=server_5xx(st),
        hedges=st.get("hedges", 0) - base.get("hedges", 0),
        retries=st["retries"] - base["retries"],
        breaker_opened=st["urls"][urls[0]]["breaker_opened"],
    )


async def drain(
    settings: RetrievalSettings, workdir: Path, *, seconds: float, clients: int = 64
) -> dict[str, Any]:
    """SIGTERM under load, no client retries: every request is answered, refused (503 / connection refused,
    i.e. never accepted) or lost (accepted, then no answer). Lost must be 0."""
    import aiohttp

    with replicas(settings, 1, workdir / "drain", {"SEARCHRL_LOG_LEVEL": "INFO"}) as (r,):
        async with RetrievalClient(r.url) as client:
            expected = await reference(client_call(client), corpus_queries(settings, 1000))
        pool = list(expected)
        counts: Counter[str] = Counter()
        latencies: list[float] = []
        stop_at = time.monotonic() + seconds

        async def worker(w: int, session: aiohttp.ClientSession) -> None:
            i = w
            while time.monotonic() < stop_at:
                q = pool[i % len(pool)]
                i += clients
                started = time.monotonic()
                try:
                    async with session.post(r.url + "/retrieve", json={"queries": [q], "topk": 3}) as resp:
                        body = await resp.json(content_type=None)
                        if resp.status == 200:
                            ids = [d["id"] for d in body["result"][0]]
                            counts["answered" if ids == expected[q] else "wrong"] += 1
                            latencies.append(time.monotonic() - started)
                        else:
                            counts[f"refused_{resp.status}"] += 1
                except aiohttp.ClientConnectorError:
                    counts["refused_connect"] += 1
                    await asyncio.sleep(0.01)
                except (TimeoutError, aiohttp.ClientError):
                    counts["lost"] += 1

        async def terminate() -> None:
            await asyncio.sleep(seconds / 2)
            r.signal(signal.SIGTERM)

        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(terminate(), *(worker(w, session) for w in range(clients)))
        assert r.proc is not None
        code = r.proc.wait(timeout=60)
    drained = re.findall(
        r"drained: (\d+) /retrieve requests answered since start, (\d+) still in flight",
        r.log_path.read_text(),
    )
    server_answered, in_flight = (int(x) for x in drained[-1]) if drained else (-1, -1)
    out = Outcome(
        sent=sum(counts.values()),
        answered=counts["answered"],
        wrong=counts["wrong"],
        lost=counts["lost"],
        latencies=latencies,
    )
    refused = {k: v for k, v in counts.items() if k.startswith("refused")}
    # Accepted = read by the server. The server answered `server_answered` (reference calls included); the
    # client received `answered` + the reference calls. A client-side disconnect on an idle keep-alive connection
    # that the server closed at shutdown was never read, so it is not lost: it counts as refused_disconnect.
    accepted_lost = server_answered - (counts["answered"] + counts["wrong"] + len(expected))
    refused["refused_disconnect"] = counts["lost"]
    out.lost = max(0, accepted_lost)
    return out.row(
        scenario=f"SIGTERM drain ({clients} clients)",
        http_5xx=0,
        refused=refused,
        server_answered=server_answered,
        in_flight_at_exit=in_flight,
        exit_signal=-code if code < 0 else code,
    )


SCENARIOS = ("soak", "overload", "kill", "hang", "freeze", "drain", "big-body", "slow", "hostile")


async def run_all(
    settings: RetrievalSettings,
    workdir: Path,
    *,
    seconds: float,
    only: Sequence[str] = SCENARIOS,
    make_call: Any = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in only:
        if name == "soak":
            rows.append(await soak(settings, workdir, seconds=seconds))
        elif name == "overload":
            rows.append(await overload(settings, workdir, seconds=min(seconds, 20)))
        elif name == "kill":
            rows.append(await replica_kill(settings, workdir, seconds=min(seconds, 30), make_call=make_call))
        elif name == "hang":
            rows.append(await replica_hang(settings, workdir, seconds=min(seconds, 30), make_call=make_call))
        elif name == "freeze":
            rows.append(await replica_freeze(settings, workdir))  # RetrievalClient with its defaults
        elif name == "drain":
            rows.append(await drain(settings, workdir, seconds=min(seconds, 10)))
        elif name == "big-body":
            rows.append(await asyncio.to_thread(big_body, settings, workdir))
        elif name == "slow":
            rows.append(await asyncio.to_thread(slow_clients, settings, workdir))
        elif name == "hostile":
            rows.append(await asyncio.to_thread(hostile_pages, workdir / "hostile", seconds=min(seconds, 25)))
    return rows


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown table docs/operations.md shows: one line per scenario, extra fields as key=value."""
    lines = [
        "| scenario | sent | answered | wrong | lost | 5xx | p99 s | other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    core = {"scenario", "sent", "answered", "wrong", "lost", "http_5xx", "p99_s"}
    for row in rows:
        other = ", ".join(f"{k}={v}" for k, v in row.items() if k not in core)
        cells = [
            str(row.get(k, ""))
            for k in ("scenario", "sent", "answered", "wrong", "lost", "http_5xx", "p99_s")
        ]
        lines.append("| " + " | ".join(cells) + f" | {other} |")
    return "\n".join(lines)


__all__ = [
    "SCENARIOS",
    "drain",
    "overload",
    "render_table",
    "replica_freeze",
    "replica_hang",
    "replica_kill",
    "run_all",
    "soak",
]
