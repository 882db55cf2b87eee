"""Dense and BM25 backends through the real registry, over the 20-passage fixture corpus."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from searchrl.errors import BackendError, IndexLoadError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.bm25 import BM25Backend
from searchrl.retrieval.backends.dense import DenseBackend
from searchrl.retrieval.index.build import ensure_index, load_manifest
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS

pytest.importorskip("faiss")

QUERIES = [
    "Who directed The Seventh Seal?",
    "Which river flows into the Caspian Sea between Europe and Asia?",
    "egg-laying venomous mammal from Australia",
]
EXPECTED_TITLES = ["The Seventh Seal", "Ural (river)", "Platypus"]


def _title(hit: ScoredDocument) -> str:
    return hit.document.contents.split("\n", 1)[0].strip('"')


def _run(coro):  # noqa: ANN001, ANN202 - tiny helper
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def dense_settings(tmp_path_factory: pytest.TempPathFactory) -> RetrievalSettings:
    # autotune off: these tests are about the backend, not the encoder's tuning (tests/retrieval/encoders/), which
    # took most of this module's time beside make test's verl runs
    return RetrievalSettings(
        backend="dense", corpus=str(TINY_CORPUS), data_dir=tmp_path_factory.mktemp("data"), autotune=False
    )


def _check_results(results: list[list[ScoredDocument]], topk: int) -> None:
    assert len(results) == len(QUERIES)
    for hits, title in zip(results, EXPECTED_TITLES, strict=True):
        assert len(hits) == topk
        assert _title(hits[0]) == title
        scores = [h.score for h in hits]
        assert all(isinstance(s, float) for s in scores)
        assert scores == sorted(scores, reverse=True)
        assert len({h.document.id for h in hits}) == topk


def test_bm25_backend_end_to_end(bm25_settings: RetrievalSettings) -> None:
    async def scenario() -> None:
        backend = build_backend(bm25_settings)
        assert isinstance(backend, BM25Backend)
        await backend.start()
        try:
            _check_results(await backend.search(QUERIES, 3), 3)
            assert [_title(h[0]) for h in await backend.search(QUERIES[::-1], 1)] == EXPECTED_TITLES[::-1]
            assert len((await backend.search(["Seventh Seal"], 50))[0]) == 20  # capped at corpus size
            # A query with no indexed word still answers (score 0) instead of failing.
            nothing = (await backend.search(["the of and"], 2))[0]
            assert len(nothing) == 2 and all(h.score == 0.0 for h in nothing)
            info = backend.info()
            assert info["backend"] == "bm25" and info["corpus_size"] == 20
            assert info["index_type"] == "bm25s" and Path(info["index_dir"]).is_dir()
        finally:
            await backend.close()

    _run(scenario())


def test_bm25_reopens_fast(bm25_settings: RetrievalSettings) -> None:
    ensure_index(bm25_settings, "bm25")
    backend = BM25Backend.from_settings(bm25_settings)
    started = time.perf_counter()
    _run(backend.start())
    assert time.perf_counter() - started < 1.0
    _run(backend.close())


def test_dense_backend_end_to_end(dense_settings: RetrievalSettings) -> None:
    threads: set[str] = set()

    async def scenario() -> None:
        backend = build_backend(dense_settings)
        assert isinstance(backend, DenseBackend)
        await backend.start()
        try:
            original = backend._search_sync

            def recording(queries: list[str], topk: int) -> list[list[ScoredDocument]]:
                threads.add(threading.current_thread().name)
                return original(queries, topk)

            backend._search_sync = recording  # type: ignore[method-assign]
            _check_results(await backend.search(QUERIES, 3), 3)
            # Concurrent requests are served in order, one worker thread owns the index.
            many = await asyncio.gather(*(backend.search([q], 2) for q in QUERIES * 4))
            assert [_title(r[0][0]) for r in many] == EXPECTED_TITLES * 4
            assert len((await backend.search(["x"], 50))[0]) == 20
            info = backend.info()
            assert info["backend"] == "dense" and info["corpus_size"] == 20 and info["dim"] == 384
            assert info["encoder"] == "bundled-minilm" and info["index_type"] == "Flat"
        finally:
            await backend.close()

    _run(scenario())
    assert len(threads) == 1 and next(iter(threads)).startswith("dense")
    manifest = load_manifest(ensure_index(dense_settings, "dense"))
    assert manifest.count == 20 and manifest.encoder and manifest.encoder["name"] == "bundled-minilm"


def test_search_before_start_is_a_backend_error(dense_settings: RetrievalSettings) -> None:
    with pytest.raises(BackendError, match="not started"):
        _run(DenseBackend.from_settings(dense_settings).search(["q"], 3))


def test_dense_refuses_an_index_built_for_another_corpus(
    dense_settings: RetrievalSettings, tmp_path: Path
) -> None:
    built = ensure_index(dense_settings, "dense")
    other = tmp_path / "edited.jsonl"
    other.write_bytes(TINY_CORPUS.read_bytes().replace(b"Bergman", b"Bergmann", 1))
    settings = dense_settings.model_copy(update={"corpus": str(other), "index_dir": built})
    backend = DenseBackend.from_settings(settings)
    with pytest.raises(IndexLoadError) as exc:
        _run(backend.start())
    message = str(exc.value)
    assert "\n" not in message and message.startswith("corpus checksum differs")


def test_dense_refuses_an_index_built_with_another_encoder(dense_settings: RetrievalSettings) -> None:
    built = ensure_index(dense_settings, "dense")
    settings = dense_settings.model_copy(update={"encoder": "intfloat/e5-base-v2", "index_dir": built})
    with pytest.raises(IndexLoadError) as exc:
        _run(DenseBackend.from_settings(settings).start())
    message = str(exc.value)
    assert "\n" not in message and message.startswith("encoder differs")
    assert "SEARCHRL_RETRIEVAL_ENCODER=bundled-minilm" in message


def test_bm25_refuses_a_dense_index_dir(dense_settings: RetrievalSettings) -> None:
    built = ensure_index(dense_settings, "dense")
    settings = dense_settings.model_copy(update={"backend": "bm25", "index_dir": built})
    with pytest.raises(IndexLoadError, match="is a dense index, but backend bm25 needs a bm25 one"):
        _run(BM25Backend.from_settings(settings).start())
