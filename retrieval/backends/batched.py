"""The skeleton the local index backends (dense, bm25) share: one worker thread behind a `Batcher`.

Every request goes through the batcher (issue 13): one bounded queue with 503 + Retry-After past `queue_size`,
a per-request deadline, the result cache and in-flight de-duplication. The index is loaded on the worker thread
and only that thread touches it afterwards. A subclass loads its index (`_load`) and answers one batch
(`_search_batch`); this class runs both there and turns an unexpected failure into a `BackendError`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from searchrl.errors import BackendError, SearchRLError
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.index.build import load_manifest, resolve_corpus, verify_manifest
from searchrl.retrieval.serving.batcher import Batcher, BatcherMetrics

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Self

    from searchrl.retrieval.corpus import DocStore
    from searchrl.retrieval.index.build import IndexManifest
    from searchrl.retrieval.schemas import ScoredDocument
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


class BatchedBackend(Backend):
    """A backend whose index lives on one worker thread and whose requests are batched across callers."""

    def __init__(
        self, settings: RetrievalSettings, *, on_idle: Callable[[bool], object] | None = None
    ) -> None:
        self.settings = settings
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._store: DocStore | None = None
        self.manifest: IndexManifest | None = None
        self.index_dir: Path | None = None
        self.open_seconds: float = 0.0  # manifest checks + index + doc store, after any build
        # The batcher's worker loop runs on that same thread, after _load; a lambda so that the batch
        # function is looked up per call.
        self._batcher = Batcher.from_settings(
            lambda queries, topk: self._search_sync(queries, topk),
            settings,
            name=self.name,
            executor=self._executor,
            on_idle=on_idle,
        )

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> Self:
        return cls(settings)

    @abc.abstractmethod
    def _load(self) -> None:
        """Open (building if missing) the index and doc store; runs on the worker thread."""

    @abc.abstractmethod
    def _started(self) -> bool:
        """Whether `_load` has finished and `close` has not run."""

    @abc.abstractmethod
    def _search_batch(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        """Hits for a batch of queries; runs on the worker thread."""

    async def start(self) -> None:
        # On the worker thread too: the thread that loads a (GPU) index is the one that uses it.
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        await self._batcher.start()

    def attach_metrics(self, metrics: BatcherMetrics) -> None:
        """Report batch sizes, queue depth/wait and cache hits to the app's metrics (see retrieval/serving/metrics.py)."""
        self._batcher.attach_metrics(metrics)

    def problem(self) -> str | None:
        return self._batcher.problem()

    def busy(self) -> str | None:
        return self._batcher.busy()

    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        if not self._started():
            raise BackendError(f"{self.name} backend is not started")
        return await self._batcher.search(queries, topk)

    def _search_sync(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        """`_search_batch`, with anything but a SearchRLError logged and raised as a BackendError."""
        try:
            return self._search_batch(queries, topk)
        except SearchRLError:
            raise
        except Exception as exc:
            log.exception("%s search failed for %d queries", self.name, len(queries))
            raise BackendError(f"{self.name} search failed: {type(exc).__name__}: {exc}") from exc

    def _checked_manifest(self, index_dir: Path) -> tuple[Path, IndexManifest]:
        """The corpus path and the manifest of the index in `index_dir`, checked against that corpus."""
        corpus_path = resolve_corpus(self.settings)
        manifest = load_manifest(index_dir)
        verify_manifest(manifest, index_dir, kind=self.name, corpus_path=corpus_path)  # type: ignore[arg-type]
        return corpus_path, manifest

    def _index_info(self, **middle: Any) -> dict[str, Any]:
        """GET /'s description: corpus and size, then the backend's own `middle` fields, then the index."""
        m = self.manifest
        return {
            "backend": self.name,
            "corpus": self.settings.corpus,
            "corpus_size": m.count if m else None,
            **middle,
            "index_dir": str(self.index_dir) if self.index_dir else None,
            "corpus_checksum": m.corpus_checksum if m else None,
            "index_fingerprint": m.fingerprint() if m else None,
        }

    async def close(self) -> None:
        await self._batcher.close()  # finishes queued queries, then frees the worker thread
        self._executor.shutdown(wait=True)
        if self._store is not None:
            self._store.close()


__all__ = ["BatchedBackend"]
