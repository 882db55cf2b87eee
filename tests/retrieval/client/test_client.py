"""RetrievalClient retries, failover and error kinds, against real loopback servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.retrieval.client import CircuitBreaker, RetrievalClient, check_health
from tests.live import free_port, healthy_app, serve_in_thread

pytestmark = pytest.mark.live

GOOD = {"result": [[{"document": {"id": "7", "contents": '"The Seventh Seal"\nA 1957 film.'}, "score": 1.5}]]}


class Script:
    """A scripted upstream: each request pops the next (status, body, headers, delay)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, Any, dict[str, str], float]] = []
        self.requests: list[dict[str, Any]] = []

    def app(self) -> FastAPI:
        app = healthy_app()

        @app.post("/retrieve")
        async def retrieve(request: Request) -> Any:
            self.requests.append({"body": await request.json(), "auth": request.headers.get("authorization")})
            status, body, headers, delay = self.steps.pop(0) if self.steps else (200, GOOD, {}, 0.0)
            if delay:
                await asyncio.sleep(delay)
            return JSONResponse(body, status_code=status, headers=headers)

        return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Script, str]]:
    script = Script()
    with serve_in_thread(script.app()) as url:
        yield script, url


@pytest.fixture()
def script(upstream: tuple[Script, str]) -> Iterator[Script]:
    s, _ = upstream
    s.steps.clear()
    s.requests.clear()
    yield s


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _search(urls: Any, **kw: Any) -> Any:
    async with RetrievalClient(urls, **{"backoff_base_s": 0.01, "backoff_max_s": 0.05, **kw}) as client:
        return await client.search(["q"], 1)


def test_success_parses_hits_and_sends_bearer(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    hits = run(_search(url, api_key="sekrit"))
    assert (
        hits[0][0].title == "The Seventh Seal"
        and hits[0][0].text == "A 1957 film."
        and hits[0][0].score == 1.5
    )
    assert script.requests[0]["auth"] == "Bearer sekrit"
    assert script.requests[0]["body"] == {"queries": ["q"], "topk": 1, "return_scores": True}


def test_failover_to_second_url(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    dead = f"http://127.0.0.1:{free_port()}"
    hits = run(_search([dead, url]))
    assert hits[0][0].id == "7"
    assert len(script.requests) == 1


def test_all_dead_raises_connect_error() -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(dead, max_retries=2))
    assert info.value.kind == "connect"
    assert "3 attempts over 2 URL(s)" in str(info.value)


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_retryable_statuses_are_retried(upstream: tuple[Script, str], script: Script, status: int) -> None:
    _, url = upstream
    script.steps += [(status, {"detail": "busy"}, {}, 0.0)] * 2
    hits = run(_search(url, max_retries=3))
    assert hits[0][0].id == "7"
    assert len(script.requests) == 3


def test_retry_after_is_honoured(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps.append((503, {"detail": "queue full"}, {"Retry-After": "1"}, 0.0))
    started = time.monotonic()
    run(_search(url))
    assert time.monotonic() - started >= 0.95
    assert len(script.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_not_retried(upstream: tuple[Script, str], script: Script, status: int) -> None:
    _, url = upstream
    script.steps.append((status, {"detail": "nope"}, {}, 0.0))
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(url, api_key="sekrit", max_retries=3))
    assert info.value.kind == f"http_{status}" and info.value.status == status
    assert "nope" in str(info.value) and "sekrit" not in str(info.value)
    assert len(script.requests) == 1


def test_exhausted_retries_report_the_last_error(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps += [(503, {"detail": "busy"}, {}, 0.0)] * 3
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(url, max_retries=2))
    assert info.value.kind == "http_503"
    assert len(script.requests) == 3


@pytest.mark.parametrize(
    "body",
    [{"nope": 1}, {"result": []}, {"result": [[{"document": {"id": "1"}, "score": 1}]]}, {"result": ["x"]}],
)
def test_malformed_response(upstream: tuple[Script, str], script: Script, body: Any) -> None:
    _, url = upstream
    script.steps.append((200, body, {}, 0.0))
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(url))
    assert info.value.kind == "malformed"


def test_timeout_kind(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps += [(200, GOOD, {}, 1.0)] * 2
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(url, timeout_s=0.2, max_retries=1))
    assert info.value.kind == "timeout"


def test_bad_urls_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="RETRIEVAL_SERVICE_URL"):
        RetrievalClient([])
    with pytest.raises(ConfigError, match="http://"):
        RetrievalClient("localhost:8000")


def test_client_reusable_across_event_loops(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    client = RetrievalClient(url)
    for _ in range(
        2
    ):  # verl runs tools in whatever loop its worker has; a new loop must not break the client
        assert run(client.search(["q"], 1))[0][0].id == "7"


def test_check_health_live(live_bm25_url: str) -> None:
    res = check_health(live_bm25_url, deadline_s=10)
    assert res.ok, res.reason
    assert res.hits[0].title == "The Seventh Seal"


def test_check_health_stopped_fails_fast() -> None:
    started = time.monotonic()
    res = check_health(f"http://127.0.0.1:{free_port()}", deadline_s=1.0)
    assert not res.ok and res.reason.startswith("unreachable")
    assert time.monotonic() - started < 5


def test_check_health_wrong_shape(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps.append((200, {"result": [[]]}, {}, 0.0))
    res = check_health(url, deadline_s=2)
    assert not res.ok and "no passages" in res.reason
    script.steps.append((200, {"hits": []}, {}, 0.0))
    res = check_health(url, deadline_s=2)
    assert not res.ok and res.reason.startswith("malformed")


def test_check_health_unauthorized(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps.append((401, {"detail": "invalid bearer token"}, {}, 0.0))
    res = check_health(url, api_key="wrong-key", deadline_s=5)
    assert not res.ok and "401" in res.reason and "wrong-key" not in res.reason
    assert len(script.requests) == 1


# --- issue 13: spread, circuit breaker, deadlines, counters ------------------------------------------------


def test_breaker_states_with_a_fake_clock() -> None:
    now = [0.0]
    br = CircuitBreaker(failures=3, reset_s=1.0, max_reset_s=4.0, clock=lambda: now[0])
    assert br.allow() and not br.record_failure("timeout") and not br.record_failure("http_500")
    assert br.record_failure("timeout") and br.state == "open" and not br.allow()
    now[0] = 1.0
    assert br.allow() and br.state == "half_open"
    assert not br.allow()  # one probe at a time
    assert br.record_failure("timeout") and br.seconds_to_probe() == 2.0  # failed probe: cool-down doubles
    now[0] = 3.0
    assert br.allow()
    br.record_success()
    assert br.state == "closed" and br.allow()
    assert br.record_failure("connect") and br.state == "open"  # a refused connection opens at once
    assert br.opened == 3


def test_round_robin_spreads_over_urls(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    other = Script()
    with serve_in_thread(other.app()) as url2:

        async def go() -> dict[str, Any]:
            async with RetrievalClient([url, url2]) as client:
                for _ in range(10):
                    await client.search(["q"], 1)
                return client.stats()

        stats = run(go())
    assert len(script.requests) == 5 and len(other.requests) == 5
    assert stats["calls"] == 10 and all(u["ok"] == 5 for u in stats["urls"].values())


def test_dead_replica_costs_one_failure_then_is_skipped(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    dead = f"http://127.0.0.1:{free_port()}"

    async def go() -> dict[str, Any]:
        async with RetrievalClient([dead, url], breaker_reset_s=60) as client:
            for _ in range(20):
                assert (await client.search(["q"], 1))[0][0].id == "7"
            return client.stats()

    stats = run(go())
    assert stats["urls"][dead] == {
        **stats["urls"][dead],
        "sent": 1,
        "failed": {"connect": 1},
        "breaker": "open",
        "breaker_opened": 1,
    }
    assert stats["urls"][url]["ok"] == 20 and len(script.requests) == 20


def test_breaker_probes_and_closes_when_the_replica_returns(
    upstream: tuple[Script, str], script: Script
) -> None:
    _, url = upstream
    port = free_port()
    back = f"http://127.0.0.1:{port}"

    async def go() -> tuple[str, str]:
        async with RetrievalClient([back, url], breaker_reset_s=0.2) as client:
            await client.search(["q"], 1)
            opened = client.stats()["urls"][back]["breaker"]
            with serve_in_thread(Script().app(), port=port):
                await asyncio.sleep(0.3)
                for _ in range(4):
                    await client.search(["q"], 1)
                return opened, client.stats()["urls"][back]["breaker"]

    assert run(go()) == ("open", "closed")


@pytest.mark.parametrize(("status", "after"), [(200, "closed"), (500, "open")])
def test_a_probe_outrun_by_its_hedge_runs_on_and_its_own_answer_is_the_verdict(
    upstream: tuple[Script, str], script: Script, status: int, after: str
) -> None:
    """A replica back from a restart answers its first requests slower than the hedge delay: its half-open probe
    loses the race. The call takes the hedge's answer at once; the probe runs on, and its own answer closes the
    breaker (200) or reopens it (500). Counting the lost race as the probe's failure reopened the breaker at each
    probe, doubling the cool-down to 30 s: the SIGKILL bench's replica stayed out 60 s after it was back."""
    _, good = upstream
    port = free_port()
    back = f"http://127.0.0.1:{port}"
    slow = Script()
    slow.steps.append((status, GOOD if status == 200 else {"detail": "boom"}, {}, 0.6))

    async def go() -> tuple[list[float], list[str], dict[str, Any]]:
        async with RetrievalClient(
            [back, good], breaker_reset_s=0.2, hedge_min_s=0.05, hedge_max_s=0.05, max_retries=0
        ) as client:
            await client.search(["q"], 1)  # refused: the breaker opens at once
            assert client.stats()["urls"][back]["breaker"] == "open"
            with serve_in_thread(slow.app(), port=port):
                await asyncio.sleep(0.3)  # past the cool-down: the next call to pick `back` is its probe
                elapsed, states = [], []
                for _ in range(6):
                    started = time.monotonic()
                    await client.search(["q"], 1)
                    elapsed.append(time.monotonic() - started)
                    if slow.requests:
                        break
                states.append(client.stats()["urls"][back]["breaker"])
                await asyncio.sleep(1.0)  # the probe's own answer arrives
                states.append(client.stats()["urls"][back]["breaker"])
                return elapsed, states, client.stats()

    elapsed, states, stats = run(go())
    assert max(elapsed) < 0.5  # the hedge's answer, not the slow probe's
    assert states == ["half_open", after]
    assert stats["urls"][back]["outrun"] == 1 and stats["urls"][back]["outstanding"] == 0
    assert stats["urls"][back]["ok"] == (1 if status == 200 else 0)


def test_retry_after_past_the_deadline_gives_up_at_once(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps.append((503, {"detail": "queue full"}, {"Retry-After": "30"}, 0.0))
    started = time.monotonic()
    with pytest.raises(RetrievalUnavailableError) as info:
        run(_search(url, deadline_s=2.0))
    assert info.value.kind == "http_503" and time.monotonic() - started < 1.0
    assert len(script.requests) == 1


def test_pool_wait_has_its_own_deadline_and_kind(upstream: tuple[Script, str], script: Script) -> None:
    _, url = upstream
    script.steps.append((200, GOOD, {}, 1.0))

    async def go() -> RetrievalUnavailableError:
        async with RetrievalClient(url, max_connections=1, pool_timeout_s=0.1, max_retries=0) as client:
            slow = asyncio.create_task(client.search(["slow"], 1))
            await asyncio.sleep(0.2)
            with pytest.raises(RetrievalUnavailableError) as info:
                await client.search(["q"], 1)
            await slow
            return info.value

    assert run(go()).kind == "pool"


def test_hung_replica_costs_one_timeout_then_the_breaker_skips_it(
    upstream: tuple[Script, str], script: Script
) -> None:
    """A replica that accepts connections but never answers (what SIGSTOP looks like)."""
    import socket

    _, url = upstream
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(128)  # the kernel completes handshakes; nobody ever reads
    hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}"

    async def go() -> tuple[float, dict[str, Any]]:
        async with RetrievalClient([hung_url, url], timeout_s=0.5, breaker_failures=1) as client:
            started = time.monotonic()
            for _ in range(10):
                assert (await client.search(["q"], 1))[0][0].id == "7"
            return time.monotonic() - started, client.stats()

    try:
        elapsed, stats = run(go())
    finally:
        hung.close()
    assert (
        stats["urls"][hung_url]["failed"] == {"timeout": 1} and stats["urls"][hung_url]["breaker"] == "open"
    )
    assert elapsed < 2.0


def test_single_url_has_no_breaker_every_attempt_is_tried() -> None:
    """One URL (SkyServe's load balancer): skipping it could only fail calls without trying."""
    dead = f"http://127.0.0.1:{free_port()}"

    async def go() -> dict[str, Any]:
        client = RetrievalClient(dead, max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02)
        with pytest.raises(RetrievalUnavailableError):
            await client.search(["q"], 1)
        await client.aclose()
        return client.stats()["urls"][dead]

    url_stats = run(go())
    assert (
        url_stats["sent"] == 3 and url_stats["breaker"] == "closed" and url_stats["failed"] == {"connect": 3}
    )


class Hanging:
    """An upstream whose /retrieve handler sleeps (for ever, by default) on the requests `hang` picks, and
    records each request's client port (one port = one connection)."""

    def __init__(self, hang: Any = lambda n: True, delay: float = 3600.0) -> None:
        self.hang = hang  # request number (0-based) -> sleep before answering?
        self.delay = delay
        self.ports: list[int] = []
        self.released = False  # set when the test ends, so the server can stop

    def app(self) -> FastAPI:
        app = healthy_app()

        @app.post("/retrieve")
        async def retrieve(request: Request) -> Any:
            n = len(self.ports)
            self.ports.append(request.client.port if request.client else 0)
            if self.hang(n):
                until = time.monotonic() + self.delay
                while not self.released and time.monotonic() < until:
                    await asyncio.sleep(0.01)
            return JSONResponse(GOOD)

        return app


@contextlib.contextmanager
def hanging(server: Hanging) -> Iterator[str]:
    with serve_in_thread(server.app()) as url:
        try:
            yield url
        finally:
            server.released = True


def test_hedge_answers_a_call_stuck_on_a_hung_replica_well_within_timeout(
    upstream: tuple[Script, str], script: Script
) -> None:
    """Issue 26, with the defaults users get: timeout_s is 10 s; the hedge (1 s before the client has seen
    20 latencies) goes to the other URL and its answer is the only one returned."""
    _, good = upstream
    with hanging(Hanging()) as hung:

        async def go() -> tuple[float, Any, dict[str, Any]]:
            async with RetrievalClient([hung, good]) as client:  # ties: the first URL gets the first call
                started = time.monotonic()
                hits = await client.search(["q"], 1)
                elapsed = time.monotonic() - started
            return elapsed, hits, client.stats()  # after aclose: the cancelled loser has unwound

        elapsed, hits, stats = run(go())
    assert 0.9 < elapsed < 3.0  # the hedge delay, not timeout_s (10 s)
    assert [[h.id for h in per_query] for per_query in hits] == [["7"]]  # one answer, not two
    assert len(script.requests) == 1
    assert (stats["hedges"], stats["hedges_won"], stats["hedges_denied"]) == (1, 1, 0)
    assert stats["urls"][hung]["outrun"] == 1 and stats["urls"][hung]["failed"] == {}
    assert stats["urls"][hung]["outstanding"] == 0  # the loser was cancelled


def test_hedges_are_capped_by_the_budget() -> None:
    """30 concurrent calls that all outlive the hedge delay: the burst (10) goes out, the rest are denied and
    counted; every call still gets exactly its one answer (the primary, which started first, wins)."""
    # 2 s, not less: a call whose answer arrives before its loop turn to hedge is neither hedged nor denied,
    # and a loaded CI machine once stalled this loop (the server shares its GIL) past a 0.5 s answer
    server = Hanging(delay=2.0)
    with hanging(server) as url:

        async def go() -> tuple[list[Any], dict[str, Any]]:
            async with RetrievalClient(url, hedge_min_s=0.05, hedge_max_s=0.05) as client:
                results = await asyncio.gather(*(client.search([f"q{i}"], 1) for i in range(30)))
                return results, client.stats()

        results, stats = run(go())
    assert all([[h.id for h in r[0]]] == [["7"]] for r in results)
    assert (stats["hedges"], stats["hedges_denied"]) == (10, 20)
    assert len(server.ports) == 40  # 30 calls + 10 hedges
    assert stats["hedges"] <= 10 + 0.1 * stats["calls"]


def test_single_url_hedges_to_the_same_url_on_a_new_connection() -> None:
    """One URL (SkyServe's load balancer, breaker off): a request wedged on its connection is hedged to the same
    URL on another connection, and that answer is returned; the breaker stays closed."""
    server = Hanging(hang=lambda n: n == 0)
    with hanging(server) as url:

        async def go() -> tuple[float, Any, dict[str, Any]]:
            async with RetrievalClient(url, hedge_min_s=0.1, hedge_max_s=0.1) as client:
                started = time.monotonic()
                hits = await client.search(["q"], 1)
                return time.monotonic() - started, hits, client.stats()

        elapsed, hits, stats = run(go())
    assert elapsed < 2.0 and [[h.id for h in hits[0]]] == [["7"]]
    assert len(server.ports) == 2 and server.ports[0] != server.ports[1]  # two connections
    assert (stats["hedges"], stats["hedges_won"]) == (1, 1)
    assert stats["urls"][url]["breaker"] == "closed" and stats["urls"][url]["breaker_opened"] == 0


# 50 ms hedge delays: beside the session's verl runs it counted 7 denials (tests/conftest.py, quiet)
@pytest.mark.quiet
def test_calls_on_a_url_whose_breaker_opens_hedge_at_once_outside_the_budget(
    upstream: tuple[Script, str], script: Script
) -> None:
    """One hedge token for 4 calls stuck on a hung replica: the first hedge outruns its primary, which opens
    the breaker (breaker_failures=1), and the other 3 are sent elsewhere at once, budget or not."""
    _, good = upstream
    with hanging(Hanging()) as hung:

        async def go() -> tuple[float, list[Any], dict[str, Any]]:
            async with RetrievalClient(
                [hung, good], timeout_s=5, breaker_failures=1, hedge_min_s=0.05, hedge_max_s=0.05
            ) as client:
                client._hedging.tokens = 0.5  # + 0.1 per call: exactly one hedge for these 8 calls
                started = time.monotonic()
                results = await asyncio.gather(*(client.search([f"q{i}"], 1) for i in range(8)))
                return time.monotonic() - started, results, client.stats()

        elapsed, results, stats = run(go())
    assert elapsed < 1.5  # not timeout_s (5 s)
    assert all([[h.id for h in r[0]]] == [["7"]] for r in results)
    assert stats["urls"][hung]["breaker"] == "open" and stats["urls"][hung]["sent"] == 4
    # one budgeted hedge; the others free once the breaker opened (denied first if their delay came sooner)
    assert (stats["hedges"], stats["hedges_won"]) == (4, 4) and stats["hedges_denied"] <= 3


def test_hedging_off_waits_for_the_attempt_timeout() -> None:
    """hedge_budget=0: the pre-issue-26 behaviour, a hung request costs the whole attempt timeout."""
    with hanging(Hanging(hang=lambda n: n == 0)) as url:

        async def go() -> tuple[float, dict[str, Any]]:
            async with RetrievalClient(url, timeout_s=0.5, hedge_budget=0, backoff_base_s=0.01) as client:
                started = time.monotonic()
                await client.search(["q"], 1)
                return time.monotonic() - started, client.stats()

        elapsed, stats = run(go())
    assert elapsed >= 0.5 and stats["hedges"] == 0 and stats["retries"] == 1
