"""Persistent query cache (SQLite) in front of any backend, with record/replay for deterministic evaluation.

    SEARCHRL_RETRIEVAL_CACHE_MODE=record searchrl serve ...   # pay once, store every answer
    SEARCHRL_RETRIEVAL_CACHE_MODE=replay searchrl serve ...   # answer only from the file, never upstream

GRPO samples n=5..16 rollouts per prompt and they repeat the same queries; a web backend would bill each one.
Modes (`cache_mode`):
  off     no cache (build_backend returns the bare backend)
  on      read-through: fresh entries (younger than cache_ttl_s; 0 = never stale) answer, misses go upstream
  record  always ask upstream and overwrite the entry (refresh a recording)
  replay  answer only from the cache, whatever the age; a miss is a BackendError naming the query. The inner
          backend is not even built, so a recorded Google run replays without GOOGLE_API_KEY.

Key: (namespace, normalised query, topk). The namespace names the backend and what determines its answers
(corpus, encoder and index for local backends, a hash of the engine id for Google, the instance for SearXNG), so
two corpora never share entries. Queries are normalised by the batcher's `normalize_query` (whitespace collapsed,
nothing else: case and width change what a cased encoder or a web engine returns, so "US" and "us" are two
entries), and the normalised text is what goes upstream, so an entry is a pure function of its key.

Concurrency: identical misses in flight at once are sent upstream once (single flight); SQLite is used from
worker threads behind a lock, in WAL mode so several server processes can share the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.errors import BackendError, CacheMissError, ConfigError
from searchrl.retrieval.backends.base import Backend
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.serving.batcher import normalize_query

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

MODES = ("off", "on", "record", "replay")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    query     TEXT NOT NULL,
    topk      INTEGER NOT NULL,
    created   REAL NOT NULL,
    hits      TEXT NOT NULL,
    PRIMARY KEY (namespace, query, topk)
)
"""


def _short_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def _corpus_identity(settings: RetrievalSettings) -> str:
    """A named corpus by name; a file by resolved path and size (a re-written file changes the size)."""
    path = Path(settings.corpus).expanduser()
    if path.is_file():
        return f"{path.resolve()}:{path.stat().st_size}"
    return settings.corpus


def cache_namespace(settings: RetrievalSettings) -> str:
    """What determines a backend's answers, as one string; entries from other namespaces never match."""
    backend = settings.backend
    if backend in ("google", "serper", "serpapi", "google-cse", "searxng"):
        return _web_namespace(settings)
    return _local_namespace(settings)


def _web_namespace(settings: RetrievalSettings) -> str:
    """Web answers depend on the provider, the pinned country/language, the blocklist and page mode."""
    provider = settings.google_provider if settings.backend == "google" else settings.backend
    extras = (
        f"|gl={settings.web_gl}|hl={settings.web_hl}"
        f"|block=sha256:{_short_hash(','.join(sorted(settings.web_blocklist)))}"
        + (f"|page={settings.web_page_words}w" if settings.web_page_mode else "")
    )
    return _provider_namespace(settings, provider) + extras


def _provider_namespace(settings: RetrievalSettings, backend: str) -> str:
    if backend == "google-cse":
        # The engine id picks the sites searched; the endpoint and the key do not change answers.
        cx = settings.google_cse_id.get_secret_value() if settings.google_cse_id else ""
        if not cx:
            raise ConfigError(
                "the query cache for backend 'google-cse' needs GOOGLE_CSE_ID (it selects which engine's entries "
                "to use; replay does not need GOOGLE_API_KEY)"
            )
        return f"google-cse|cx=sha256:{_short_hash(cx)}"
    if backend in ("serper", "serpapi"):
        return f"google-serp|{backend}"
    return f"searxng|{settings.searxng_base_url}"


def _local_namespace(settings: RetrievalSettings) -> str:
    backend = settings.backend
    parts = [backend, f"corpus={_corpus_identity(settings)}"]
    if settings.index_dir is not None:
        parts.append(f"index_dir={Path(settings.index_dir).resolve()}")
    if backend in ("dense", "hybrid"):
        parts += [f"encoder={settings.encoder}", f"index={settings.index_type}"]
        if "IVF" in settings.index_type:
            parts.append(f"nprobe={settings.nprobe}")
        if "HNSW" in settings.index_type:
            parts.append(f"ef_search={settings.ef_search}")
    if backend == "hybrid":
        parts += [
            f"rrf_k={settings.hybrid_rrf_k:g}",
            f"w={settings.hybrid_dense_weight:g},{settings.hybrid_bm25_weight:g}",
            f"depth={settings.hybrid_depth}",
        ]
    return "|".join(parts)


class QueryCache:
    """The SQLite store: (namespace, query, topk) -> hits as JSON, with the time they were written.

    Methods are blocking (call them from a worker thread in async code) and thread-safe.
    """

    def __init__(self, path: Path, *, ttl_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the query cache {self.path}: {exc}; set SEARCHRL_RETRIEVAL_CACHE_PATH to a "
                "writable file"
            ) from exc

    def get_many(
        self, namespace: str, queries: Iterable[str], topk: int, *, ignore_ttl: bool = False
    ) -> tuple[dict[str, list[ScoredDocument]], int]:
        """Fresh entries for `queries` (already normalised), and how many were found but stale."""
        wanted = list(dict.fromkeys(queries))
        found: dict[str, list[ScoredDocument]] = {}
        stale = 0
        if not wanted:
            return found, stale
        oldest = 0.0 if ignore_ttl or not self.ttl_s else self._clock() - self.ttl_s
        with self._lock:
            rows: list[tuple[str, float, str]] = []
            for i in range(0, len(wanted), 500):  # SQLite caps bound parameters per statement
                chunk = wanted[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows += self._db.execute(
                    f"SELECT query, created, hits FROM entries WHERE namespace = ? AND topk = ? "
                    f"AND query IN ({marks})",
                    [namespace, topk, *chunk],
                ).fetchall()
        for query, created, hits in rows:
            if created < oldest:
                stale += 1
                continue
            found[query] = [ScoredDocument.model_validate(h) for h in json.loads(hits)]
        return found, stale

    def put_many(self, namespace: str, entries: dict[str, list[ScoredDocument]], topk: int) -> None:
        now = self._clock()
        rows = [
            (namespace, query, topk, now, json.dumps([h.model_dump() for h in hits], ensure_ascii=False))
            for query, hits in entries.items()
        ]
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)", rows)
            self._db.commit()

    def count(self, namespace: str | None = None) -> int:
        with self._lock:
            if namespace is None:
                return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
            return int(
                self._db.execute("SELECT COUNT(*) FROM entries WHERE namespace = ?", (namespace,)).fetchone()[
                    0
                ]
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedBackend(Backend):
    """Any backend behind a `QueryCache`; the Backend contract is unchanged for the app.

    `inner` may be None only in replay mode, where nothing goes upstream. Counters: hits (answered from the
    cache), misses (sent upstream), stale (found but older than the TTL), stores (entries written).
    """

    def __init__(
        self, inner: Backend | None, cache: QueryCache, *, namespace: str, mode: str, name: str | None = None
    ) -> None:
        if mode not in MODES or mode == "off":
            raise ConfigError(f"cache mode {mode!r} is not one of on, record, replay")
        if inner is None and mode != "replay":
            raise ConfigError(f"cache mode {mode!r} needs a backend to fill the cache")
        self.inner = inner
        self.cache = cache
        self.namespace = namespace
        self.mode = mode
        self.name = name or (inner.name if inner is not None else "cache")
        self.hits = 0
        self.misses = 0
        self.stale = 0
        self.stores = 0
        self._inflight: dict[tuple[str, int], asyncio.Future[list[ScoredDocument]]] = {}

    async def start(self) -> None:
        if self.inner is not None:
            await self.inner.start()

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()
        await asyncio.to_thread(self.cache.close)

    def attach_metrics(self, metrics: Any) -> None:
        """Forward the app's batch metrics to the wrapped backend, if it batches."""
        attach = getattr(self.inner, "attach_metrics", None)
        if attach is not None:
            attach(metrics)

    def stats(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "path": str(self.cache.path),
            "hits": self.hits,
            "misses": self.misses,
            "stale": self.stale,
            "stores": self.stores,
        }

    def info(self) -> dict[str, Any]:
        base = self.inner.info() if self.inner is not None else {"backend": self.name}
        return {**base, "query_cache": self.stats()}

    async def search(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        keys = [normalize_query(q) for q in queries]
        if self.mode == "record":
            found: dict[str, list[ScoredDocument]] = {}
        else:
            found, stale = await asyncio.to_thread(
                self.cache.get_many, self.namespace, keys, topk, ignore_ttl=self.mode == "replay"
            )
            self.stale += stale
        self.hits += sum(1 for k in keys if k in found)
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing:
            if self.mode == "replay":
                raise CacheMissError(
                    f"replay mode: {len(missing)} of {len(set(keys))} queries are not in the cache "
                    f"{self.cache.path} for {self.name} at topk={topk} (first: {missing[0]!r}); record them "
                    "first with SEARCHRL_RETRIEVAL_CACHE_MODE=record"
                )
            found.update(await self._fetch(missing, topk))
        return [found[k] for k in keys]

    async def _fetch(self, keys: list[str], topk: int) -> dict[str, list[ScoredDocument]]:
        """Ask upstream for `keys`, joining requests already in flight for the same key (single flight)."""
        assert self.inner is not None
        loop = asyncio.get_running_loop()
        waiting = {k: self._inflight[(k, topk)] for k in keys if (k, topk) in self._inflight}
        owned = [k for k in keys if k not in waiting]
        futures = {k: loop.create_future() for k in owned}
        for k, fut in futures.items():
            self._inflight[(k, topk)] = fut
        self.hits += len(waiting)  # answered by another request's upstream call
        self.misses += len(owned)
        try:
            if owned:
                hits = await self.inner.search(owned, topk)
                if len(hits) != len(owned):
                    raise BackendError(
                        f"{self.name} returned {len(hits)} result lists for {len(owned)} queries"
                    )
                fetched = dict(zip(owned, hits, strict=True))
                await asyncio.to_thread(self.cache.put_many, self.namespace, fetched, topk)
                self.stores += len(fetched)
                for k, fut in futures.items():
                    fut.set_result(fetched[k])
        except BaseException as exc:
            shared: BaseException = exc
            if isinstance(exc, asyncio.CancelledError):  # the owner went away; the joiners did not
                shared = BackendError(
                    f"{self.name}: the upstream request this query joined was cancelled; retry"
                )
            for fut in futures.values():
                if not fut.done():
                    fut.set_exception(shared)
                    fut.exception()  # mark retrieved: with no other waiter asyncio would log it at GC
            raise
        finally:
            for k in owned:
                self._inflight.pop((k, topk), None)
        out = {k: fut.result() for k, fut in futures.items()}
        for k, fut in waiting.items():
            out[k] = await asyncio.shield(fut)
        return out


def default_cache_path(settings: RetrievalSettings) -> Path:
    return (
        Path(settings.cache_path) if settings.cache_path else Path(settings.data_dir) / "query_cache.sqlite"
    )


def build_cached_backend(
    settings: RetrievalSettings, build_uncached: Callable[[RetrievalSettings], Backend]
) -> Backend:
    """What `build_backend` returns when cache_mode is not off: the backend behind the query cache.

    In replay mode the inner backend is not built: nothing goes upstream, so no keys or index are needed.
    """
    mode = settings.cache_mode
    inner = None if mode == "replay" else build_uncached(settings)
    cache = QueryCache(default_cache_path(settings), ttl_s=settings.cache_ttl_s)
    namespace = cache_namespace(settings)
    log.info(
        "query cache %s (mode %s, %d entries for this backend)", cache.path, mode, cache.count(namespace)
    )
    return CachedBackend(inner, cache, namespace=namespace, mode=mode, name=settings.backend)


__all__ = [
    "CachedBackend",
    "QueryCache",
    "build_cached_backend",
    "cache_namespace",
    "default_cache_path",
]
