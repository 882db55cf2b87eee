"""searchrl/http.py: Retry-After in both forms, the jittered back-off, the retry loop and the readiness poll."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest

from searchrl.errors import RetryableError
from searchrl.http import backoff_s, bearer_headers, retry_after_s, retrying, wait_until_ready

NOW = 1_800_000_000.0


def test_retry_after_reads_seconds_and_http_dates() -> None:
    date = format_datetime(datetime.fromtimestamp(NOW + 30, tz=UTC), usegmt=True)
    assert retry_after_s("7", now=lambda: NOW) == 7.0
    assert retry_after_s(date, now=lambda: NOW) == pytest.approx(30.0)
    past = format_datetime(datetime.fromtimestamp(NOW - 30, tz=UTC), usegmt=True)
    assert retry_after_s(past, now=lambda: NOW) == 0.0  # already due: no wait, never a negative one
    assert [retry_after_s(v) for v in (None, "", "soon", "-5")] == [None, None, None, 0.0]


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    for attempt, cap in [(0, 1.0), (1, 2.0), (3, 8.0), (10, 20.0)]:
        waits = [backoff_s(attempt, base_s=1.0, max_s=20.0) for _ in range(50)]
        assert all(cap / 2 <= w <= cap for w in waits)
    assert all(0 <= backoff_s(2, base_s=1.0, max_s=20.0, jitter=1.0) <= 4.0 for _ in range(50))


def test_bearer_header_only_with_a_key() -> None:
    assert (
        bearer_headers("k") == {"Authorization": "Bearer k"}
        and bearer_headers(None) == bearer_headers("") == {}
    )


def test_retrying_honours_retry_after_and_reraises_the_last_retryable() -> None:
    tries: list[int] = []

    async def go() -> None:
        async for attempt in retrying(attempts=3, base_s=0.001, max_s=0.002, retry_after_max_s=0.05):
            with attempt:
                tries.append(attempt.retry_state.attempt_number)
                raise RetryableError("HTTP 503", retry_after=0.05)

    loop_time = asyncio.new_event_loop()
    try:
        started = loop_time.time()
        with pytest.raises(RetryableError, match="HTTP 503"):
            loop_time.run_until_complete(go())
        assert loop_time.time() - started >= 0.09  # two Retry-After waits of 0.05 s, not the 2 ms back-off
    finally:
        loop_time.close()
    assert tries == [1, 2, 3]


def test_retrying_does_not_retry_other_errors() -> None:
    tries = itertools.count()

    async def go() -> None:
        async for attempt in retrying(attempts=5, base_s=0.001, max_s=0.001):
            with attempt:
                next(tries)
                raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        asyncio.run(go())
    assert next(tries) == 1


def test_wait_until_ready_polls_through_connection_errors() -> None:
    answers = iter([httpx.ConnectError("refused"), ConnectionRefusedError(), False, True])

    def probe() -> bool:
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert wait_until_ready(probe, timeout_s=5, interval_s=0.001) is True
    assert wait_until_ready(lambda: False, timeout_s=0.05, interval_s=0.01) is False


def test_wait_until_ready_lets_a_probe_end_the_wait() -> None:
    def exited() -> bool:
        raise RuntimeError("the server exited with 1")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until_ready(exited, timeout_s=5, interval_s=0.001)
