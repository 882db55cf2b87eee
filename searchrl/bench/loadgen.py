"""The benchmark's load generators: closed-loop HTTP/1.1 clients for POST /retrieve, run in their own process.

    echo '{"url": ..., "scenario": {...}, "queries": [...]}' | python -c \\
        "from searchrl.bench.loadgen import loadgen_main; loadgen_main()"

Two clients, the same job and the same checks, so their numbers can be compared:
- `raw` (the default since issue 14): one asyncio protocol per keep-alive connection on uvloop, request bytes
  encoded before the clock starts, responses parsed by httptools (the C parser uvicorn uses), and the next
  request written from the response's completion callback, with no task, future or session per request.
  It is what wrk does. Why: on a 2-core box the load generator shares the cores with the server it measures,
  and aiohttp's client spent about as much CPU per request as the whole server (measured in docs/sizing.md),
  so the service's numbers were partly the client's.
- `aiohttp`: the client the benchmark used before (a session with a connection per client).
Both count a request as answered only when the status is 200 and the body is JSON whose `result` holds one
list per query sent; anything else is an error of a named kind (`http_<status>`, `wrong_count`, `bad_body`,
the exception's name). Each reports its own CPU seconds (getrusage), so CPU per request is in the output.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from urllib.parse import urlsplit

from pydantic_core import from_json  # several times faster than json.loads on a response body

TOPK = 3
CLIENTS = ("raw", "aiohttp")


def request_bodies(
    queries: list[str], *, queries_per_request: int, repeat: int, repeat_mode: str
) -> list[tuple[bytes, int]]:
    """(JSON body, number of queries in it) in send order.

    repeat_mode "stream": every query `repeat` times in a row in the shared stream, so concurrent clients send
    the copies at once (GRPO's n samples rolled out together: in-flight de-duplication); "client": each body
    once here, and every client sends the body it took `repeat` times in a row (the result cache).
    """
    copies = 1 if repeat_mode == "client" else repeat
    stream = [q for q in queries for _ in range(copies)]
    qpr = queries_per_request
    return [
        (json.dumps({"queries": stream[i : i + qpr], "topk": TOPK, "return_scores": True}).encode(), qpr)
        for i in range(0, len(stream) - qpr + 1, qpr)
    ]


def check_response(status: int, body: bytes, expected: int) -> str | None:
    """None when the answer is what the benchmark asked for, else the error kind to count."""
    if status != 200:
        return f"http_{status}"
    try:
        result = from_json(body)["result"]
    except (ValueError, KeyError, TypeError):
        return "bad_body"
    if not isinstance(result, list) or len(result) != expected:
        return "wrong_count"
    return None


class _Tally:
    """What one scenario measured, shared by all its clients (one event loop, so no locks)."""

    def __init__(
        self,
        bodies: list[tuple[bytes, int]],
        *,
        seconds: float,
        max_requests: int,
        repeat: int,
        per_client: bool,
    ) -> None:
        self.bodies: Iterator[tuple[bytes, int]] = iter(bodies)
        self.end = 0.0
        self.seconds = seconds
        self.max_requests = max_requests
        self.repeat = repeat
        self.per_client = per_client
        self.sent = 0
        self.requests = 0
        self.queries = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def next_body(self, current: tuple[bytes, int] | None, mine: int) -> tuple[bytes, int] | None:
        """The body a client sends next, or None when the scenario is over for it."""
        if time.perf_counter() >= self.end or self.sent >= self.max_requests:
            return None
        if current is None or not self.per_client or mine % self.repeat == 0:
            current = next(self.bodies, None)
        if current is not None:
            self.sent += 1
        return current

    def result(self, elapsed: float) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "queries": self.queries,
            "seconds": elapsed,
            "latencies": self.latencies,
            "errors": self.errors,
        }


def _request_head(host: str, port: int, path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: "
    ).encode()


class _RawConnection(asyncio.Protocol):
    """One closed-loop client on one keep-alive connection: send, parse the answer, send the next."""

    def __init__(self, tally: _Tally, head: bytes, done: Callable[[], None]) -> None:
        import httptools

        self.tally = tally
        self.head = head
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: tuple[bytes, int] | None = None
        self.mine = 0
        self.chunks: list[bytes] = []
        self.t0 = 0.0
        self.waiting = False  # a request is out and its answer not complete
        self.finished = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail("bad_http")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiting:
            self.waiting = False
            self.tally.error(type(exc).__name__ if exc else "ConnectionClosed")
        self._finish()

    # --- httptools callbacks -------------------------------------------------------------------------------
    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        latency = time.perf_counter() - self.t0
        self.waiting = False
        assert self.body is not None
        kind = check_response(self.parser.get_status_code(), b"".join(self.chunks), self.body[1])
        self.chunks.clear()
        tally = self.tally
        if kind is None:
            tally.latencies.append(latency)
            tally.requests += 1
            tally.queries += self.body[1]
        else:
            tally.error(kind)
        if not self.parser.should_keep_alive():
            self._finish()  # the server closes: this client is done (the benchmark's server keeps them)
            return
        self.send_next()

    # --- the client loop -----------------------------------------------------------------------------------
    def send_next(self) -> None:
        body = self.tally.next_body(self.body, self.mine)
        if body is None or self.transport is None or self.transport.is_closing():
            self._finish()
            return
        self.body = body
        self.mine += 1
        payload = body[0]
        self.waiting = True
        self.t0 = time.perf_counter()
        self.transport.write(b"%s%d\r\n\r\n%s" % (self.head, len(payload), payload))

    def _fail(self, kind: str) -> None:
        self.waiting = False
        self.tally.error(kind)
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.done()


def _tally_for(sc: Any, queries: list[str]) -> _Tally:
    """One scenario's request stream and counters (both clients send the same bodies in the same order)."""
    return _Tally(
        request_bodies(
            queries, queries_per_request=sc.queries_per_request, repeat=sc.repeat, repeat_mode=sc.repeat_mode
        ),
        seconds=sc.seconds,
        max_requests=sc.max_requests,
        repeat=sc.repeat,
        per_client=sc.repeat_mode == "client",
    )


async def drive_raw(url: str, sc: Any, queries: list[str]) -> dict[str, Any]:
    """The raw client: `sc.clients` connections, opened before the clock starts, each closed-loop."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    tally = _tally_for(sc, queries)
    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    remaining = sc.clients
    head = _request_head(host, port, "/retrieve")

    def one_done() -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0 and not all_done.done():
            all_done.set_result(None)

    conns = []
    for _ in range(sc.clients):
        _, conn = await loop.create_connection(lambda: _RawConnection(tally, head, one_done), host, port)
        conns.append(conn)
    started = time.perf_counter()
    tally.end = started + sc.seconds
    for conn in conns:
        conn.send_next()
    try:
        await asyncio.wait_for(all_done, timeout=sc.seconds + 60)
    except TimeoutError:  # answers that never came: count them, close the connections
        for conn in conns:
            if conn.waiting:
                conn._fail("TimeoutError")
    return tally.result(time.perf_counter() - started)


async def drive_aiohttp(url: str, sc: Any, queries: list[str]) -> dict[str, Any]:
    """The aiohttp client (the benchmark's client before issue 14): one session, a connection per client."""
    import aiohttp

    tally = _tally_for(sc, queries)
    connector = aiohttp.TCPConnector(limit=sc.clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        body: tuple[bytes, int] | None = None
        mine = 0
        while (body := tally.next_body(body, mine)) is not None:
            mine += 1
            t0 = time.perf_counter()
            try:
                async with session.post(url + "/retrieve", data=body[0], headers=headers) as resp:
                    kind = check_response(resp.status, await resp.read(), body[1])
            except (TimeoutError, aiohttp.ClientError) as exc:
                kind = type(exc).__name__
            if kind is not None:
                tally.error(kind)
                continue
            tally.latencies.append(time.perf_counter() - t0)
            tally.requests += 1
            tally.queries += body[1]

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        tally.end = started + sc.seconds
        await asyncio.gather(*(worker(session) for _ in range(sc.clients)))
        elapsed = time.perf_counter() - started
    return tally.result(elapsed)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drive(url: str, sc: Any, queries: list[str]) -> dict[str, Any]:
    """Run one scenario with the client `sc.client` names, on uvloop where installed; adds `client_cpu_s`."""
    if sc.client not in CLIENTS:
        raise ValueError(f"unknown load generator {sc.client!r}; use one of {', '.join(CLIENTS)}")
    driver = drive_raw if sc.client == "raw" else drive_aiohttp
    run: Callable[[Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]]  # uvloop's run, or asyncio's
    try:
        from uvloop import run
    except ImportError:  # pragma: no cover - uvloop is in the retrieval extra
        run = asyncio.run
    cpu0 = _cpu_seconds()
    result: dict[str, Any] = run(driver(url, sc, queries))
    result["client_cpu_s"] = _cpu_seconds() - cpu0
    return result


def loadgen_main() -> None:
    """Entry of the client process: job JSON on stdin, results JSON on stdout."""
    from searchrl.bench.service_load import Scenario

    job = json.loads(sys.stdin.read())
    result = drive(job["url"], Scenario(**job["scenario"]), job["queries"])
    sys.stdout.write(json.dumps(result))


__all__ = ["CLIENTS", "check_response", "drive", "loadgen_main", "request_bodies"]
