"""Fixtures shared by the retrieval tests: the fake web-search APIs (Custom Search, Serper, SearXNG)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.retrieval.fake_web import FakeSearchAPIs, serve_fake


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeSearchAPIs]:
    """One real uvicorn fake on a loopback port for the whole session."""
    with serve_fake() as apis:
        yield apis


@pytest.fixture
def fake(fake_server: FakeSearchAPIs) -> FakeSearchAPIs:
    """The fake with its counters, scripted failures and budget state cleared."""
    fake_server.reset()
    return fake_server
