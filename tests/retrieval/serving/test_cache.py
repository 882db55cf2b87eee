"""Persistent query cache: modes, TTL, counters, single flight, and record-then-replay with zero upstream calls."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from searchrl.errors import BackendError, ConfigError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.serving.cache import CachedBackend, QueryCache, cache_namespace
from searchrl.retrieval.settings import RetrievalSettings
from tests.retrieval.fake_web import CSE_ID, GOOGLE_KEY, FakeSearchAPIs, web_settings


def hit(doc_id: str, score: float = 1.0) -> ScoredDocument:
    return ScoredDocument(
        document=Document(id=doc_id, contents=f'"{doc_id}"\ntext', url=f"https://x/{doc_id}"), score=score
    )


async def searched(backend: Any, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
    await backend.start()
    try:
        return await backend.search(queries, topk)
    finally:
        await backend.close()


class CasedBackend(Backend):
    """A backend whose answer depends on case, as a cased encoder's does: it records what reaches it."""

    name = "cased"

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        self.seen += queries
        return [[hit(f"doc-for-{q}")] for q in queries]


def test_the_cache_keeps_case_and_sends_the_queries_text_upstream(tmp_path: Path) -> None:
    """Issue 33 bug 3: the cache used to key (and send upstream) a lowercased query while the batcher keeps case,
    so "US" and "us" shared one entry although a cased encoder ranks them differently."""
    inner = CasedBackend()
    cached = CachedBackend(inner, QueryCache(tmp_path / "c.sqlite"), namespace="ns", mode="on")
    first = asyncio.run(searched(cached, ["US  troops", "us troops"], 3))
    assert inner.seen == ["US troops", "us troops"]  # whitespace collapsed, as the batcher does; case kept
    assert [r[0].document.id for r in first] == ["doc-for-US troops", "doc-for-us troops"]
    again = asyncio.run(
        searched(
            CachedBackend(inner, QueryCache(tmp_path / "c.sqlite"), namespace="ns", mode="on"),
            ["US troops"],
            3,
        )
    )
    assert again[0][0].document.id == "doc-for-US troops" and inner.seen == ["US troops", "us troops"]


def test_store_round_trip_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    cache = QueryCache(path)
    cache.put_many("ns", {"q1": [hit("a", 0.5), hit("b", 0.25)], "q2": []}, 3)
    cache.close()
    reopened = QueryCache(path)
    found, stale = reopened.get_many("ns", ["q1", "q2", "q3"], 3)
    assert stale == 0 and set(found) == {"q1", "q2"}
    assert found["q1"] == [hit("a", 0.5), hit("b", 0.25)]
    assert found["q1"][0].document.url == "https://x/a"  # extra document fields survive
    assert reopened.get_many("ns", ["q1"], 5)[0] == {}  # topk is part of the key
    assert reopened.get_many("other", ["q1"], 3)[0] == {}  # so is the namespace


def test_ttl_makes_old_entries_stale_but_replay_ignores_it(tmp_path: Path) -> None:
    now = [1000.0]
    cache = QueryCache(tmp_path / "c.sqlite", ttl_s=60, clock=lambda: now[0])
    cache.put_many("ns", {"q": [hit("a")]}, 3)
    now[0] += 59
    assert set(cache.get_many("ns", ["q"], 3)[0]) == {"q"}
    now[0] += 2
    assert cache.get_many("ns", ["q"], 3) == ({}, 1)
    assert set(cache.get_many("ns", ["q"], 3, ignore_ttl=True)[0]) == {"q"}


def test_unwritable_cache_path_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="SEARCHRL_RETRIEVAL_CACHE_PATH"):
        QueryCache(blocker / "sub" / "c.sqlite")


def test_cache_is_safe_across_threads(tmp_path: Path) -> None:
    cache = QueryCache(tmp_path / "c.sqlite")
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(20):
                cache.put_many("ns", {f"q{i}-{j}": [hit(f"d{i}-{j}")]}, 3)
                assert cache.get_many("ns", [f"q{i}-{j}"], 3)[0][f"q{i}-{j}"][0].document.id == f"d{i}-{j}"
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and cache.count("ns") == 160


def test_namespace_tells_corpora_and_engines_apart(tmp_path: Path) -> None:
    bm25 = RetrievalSettings(backend="bm25", corpus="bundled")
    other = RetrievalSettings(backend="bm25", corpus="wiki18")
    dense = RetrievalSettings(backend="dense", corpus="bundled")
    hybrid = RetrievalSettings(backend="hybrid", corpus="bundled")
    assert len({cache_namespace(s) for s in (bm25, other, dense, hybrid)}) == 4
    assert cache_namespace(hybrid) != cache_namespace(hybrid.model_copy(update={"hybrid_rrf_k": 10.0}))
    google = RetrievalSettings(backend="google-cse", google_api_key=GOOGLE_KEY, google_cse_id=CSE_ID)
    ns = cache_namespace(google)
    assert GOOGLE_KEY not in ns and CSE_ID not in ns
    assert ns != cache_namespace(google.model_copy(update={"google_cse_id": SecretStr("another-engine")}))


def test_build_backend_wraps_only_when_cache_is_on(tmp_path: Path) -> None:
    settings = RetrievalSettings(backend="google-cse", google_api_key=GOOGLE_KEY, google_cse_id=CSE_ID)
    assert not isinstance(build_backend(settings), CachedBackend)
    cached = build_backend(
        settings.model_copy(update={"cache_mode": "on", "cache_path": tmp_path / "c.sqlite"})
    )
    assert isinstance(cached, CachedBackend) and cached.name == "google-cse"
    assert cached.info()["query_cache"]["mode"] == "on"


@pytest.mark.live
def test_on_mode_serves_repeats_from_the_cache(tmp_path: Path, fake: FakeSearchAPIs) -> None:
    settings = web_settings(fake, cache_mode="on", cache_path=tmp_path / "c.sqlite")
    backend = build_backend(settings)
    assert isinstance(backend, CachedBackend)

    async def go() -> None:
        await backend.start()
        first = await backend.search(["The Seventh Seal", "black death"], 3)
        again = await backend.search(["The   Seventh Seal", " black death", "chess"], 3)
        assert again[:2] == first
        await backend.close()

    asyncio.run(go())
    assert (
        fake.count("google") == 3
    )  # seventh seal, black death, chess: each once (whitespace is not a query)
    assert [r["params"]["q"] for r in fake.requests] == ["The Seventh Seal", "black death", "chess"]
    assert backend.stats()["hits"] == 2 and backend.stats()["misses"] == 3 and backend.stats()["stores"] == 3


@pytest.mark.live
def test_record_then_replay_makes_zero_upstream_calls(tmp_path: Path, fake: FakeSearchAPIs) -> None:
    queries = ["the seventh seal", "forbidden city emperors", "ada lovelace", "platypus", "absolute zero"]
    path = tmp_path / "recording.sqlite"
    recorded = asyncio.run(
        searched(build_backend(web_settings(fake, cache_mode="record", cache_path=path)), queries, 3)
    )
    assert fake.count("google") == len(queries)
    # record mode always asks upstream, even for queries already stored
    asyncio.run(
        searched(build_backend(web_settings(fake, cache_mode="record", cache_path=path)), queries[:1], 3)
    )
    assert fake.count("google") == len(queries) + 1
    fake.reset()

    # replay: no key, no engine id, no reachable upstream needed; the answers are the recorded ones
    replay_settings = RetrievalSettings(
        backend="google-cse",
        cache_mode="replay",
        cache_path=path,
        google_cse_id=CSE_ID,
        google_base_url="http://127.0.0.1:9/x",
    )
    replay = build_backend(replay_settings)
    assert isinstance(replay, CachedBackend) and replay.inner is None
    replayed = asyncio.run(searched(replay, queries, 3))
    assert fake.count() == 0
    assert replayed == recorded
    assert [[h.model_dump() for h in q] for q in replayed] == [[h.model_dump() for h in q] for q in recorded]
    assert replay.stats()["hits"] == len(queries) and replay.stats()["misses"] == 0

    with pytest.raises(
        BackendError, match=r"replay mode: 1 of 2 queries are not in the cache .*'chess'.*record"
    ):
        asyncio.run(searched(build_backend(replay_settings), ["platypus", "chess"], 3))
    with pytest.raises(BackendError, match="not in the cache"):
        asyncio.run(searched(build_backend(replay_settings), ["platypus"], 5))  # other topk
    assert fake.count() == 0
    with pytest.raises(ConfigError, match="needs GOOGLE_CSE_ID"):
        build_backend(replay_settings.model_copy(update={"google_cse_id": None}))


@pytest.mark.live
def test_identical_concurrent_misses_go_upstream_once(tmp_path: Path, fake: FakeSearchAPIs) -> None:
    fake.plan.append(("sleep", 0.3))  # keep the first request in flight while the others arrive
    backend = build_backend(web_settings(fake, cache_mode="on", cache_path=tmp_path / "c.sqlite"))

    async def go() -> list[list[list[ScoredDocument]]]:
        await backend.start()
        out = await asyncio.gather(*(backend.search(["The Seventh Seal"], 3) for _ in range(8)))
        await backend.close()
        return out

    results = asyncio.run(go())
    assert fake.count("google") == 1
    assert all(r == results[0] for r in results) and results[0][0]


@pytest.mark.live
def test_errors_are_not_cached(tmp_path: Path, fake: FakeSearchAPIs) -> None:
    settings = web_settings(fake, cache_mode="on", cache_path=tmp_path / "c.sqlite", web_max_retries=0)
    fake.plan.append("500")
    with pytest.raises(BackendError, match="HTTP 500"):
        asyncio.run(searched(build_backend(settings), ["the seventh seal"], 3))
    [hits] = asyncio.run(searched(build_backend(settings), ["the seventh seal"], 3))
    assert hits and fake.count("google") == 2
    assert QueryCache(tmp_path / "c.sqlite").count() == 1


def test_replay_over_a_local_backend_needs_no_index(tmp_path: Path, bm25_settings: RetrievalSettings) -> None:
    """bm25 over the tiny corpus, recorded; replay then answers without building or opening the index."""
    path = tmp_path / "c.sqlite"
    record = bm25_settings.model_copy(update={"cache_mode": "record", "cache_path": path})
    recorded = asyncio.run(searched(build_backend(record), ["who directed the seventh seal", "platypus"], 3))
    assert recorded[0][0].document.contents.startswith('"The Seventh Seal"')
    replay_settings = record.model_copy(update={"cache_mode": "replay", "data_dir": tmp_path / "empty"})
    replay = build_backend(replay_settings)
    assert isinstance(replay, CachedBackend) and replay.inner is None
    assert asyncio.run(searched(replay, ["who  directed the seventh seal ", "platypus"], 3)) == recorded
    assert not (tmp_path / "empty").exists()


def test_replay_miss_is_a_404_through_the_app(tmp_path: Path) -> None:
    """A replay miss can never succeed on retry, so it must not be a 5xx that clients retry."""
    from fastapi.testclient import TestClient

    from searchrl.retrieval.serving.app import create_app

    settings = RetrievalSettings(
        backend="bm25", data_dir=tmp_path, cache_mode="replay", cache_path=tmp_path / "empty.sqlite"
    )
    with TestClient(create_app(settings)) as client:
        r = client.post("/retrieve", json={"queries": ["never recorded"], "topk": 3})
    assert r.status_code == 404
    assert "record them first" in r.json()["detail"]
