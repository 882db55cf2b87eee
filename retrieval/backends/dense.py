"""Dense backend: a query encoder plus a FAISS index over the corpus (inner product on normalised vectors).

All model and index work runs on ONE dedicated worker thread: FAISS GPU indexes are not thread-safe even
for reads (DESIGN.md section 2), torch CPU inference already uses every core, and the event loop must stay
free. `_search_sync(queries, topk)` takes a whole batch, so a cross-request batcher can call it directly.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from searchrl.errors import IndexLoadError
from searchrl.retrieval.backends.batched import BatchedBackend
from searchrl.retrieval.corpus import DocStore
from searchrl.retrieval.heap import HeapTrimmer, trim_heap
from searchrl.retrieval.index.build import (
    FAISS_FILE,
    OFFSETS,
    ensure_index,
    verify_manifest,
)
from searchrl.retrieval.schemas import ScoredDocument

if TYPE_CHECKING:
    from pathlib import Path

    from searchrl.retrieval.encoders.pool import EncoderPool
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


def read_faiss_index(path: Path) -> Any:
    """Read an index, memory-mapped where the index type supports it (Flat, IVF lists), else into RAM.

    mmap lets a 64 GB Flat index start serving at once and share page cache across worker processes.
    """
    import faiss

    read_only = faiss.IO_FLAG_READ_ONLY
    # IO_FLAG_MMAP alone maps only IVF inverted lists: a Flat/SQ/HNSW file was still copied into RAM (measured:
    # 412 ms for 460 MB). IO_FLAG_MMAP_IFC maps their codes too (0.2 ms), but IVF files refuse it; so try
    # both, then IVF-only mmap (issue 4).
    attempts = [faiss.IO_FLAG_MMAP | read_only]
    if hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        attempts.insert(0, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_MMAP_IFC | read_only)
    for flags in attempts:
        try:
            return faiss.read_index(str(path), flags)
        except RuntimeError:
            continue
    log.debug("index type of %s does not support mmap; reading it into memory", path)
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "unreadable"
        raise IndexLoadError(f"cannot read FAISS index {path} ({last}); rebuild with --force") from None


class DenseBackend(BatchedBackend):
    """A query encoder plus a FAISS index; model and index work on BatchedBackend's one worker thread."""

    name = "dense"

    def __init__(self, settings: RetrievalSettings) -> None:
        # Freed heap goes back to the OS when a burst is over (issue 24: RSS grew with every run of new
        # queries; retrieval/heap.py).
        self.heap_trimmer = HeapTrimmer()
        super().__init__(settings, on_idle=self.heap_trimmer)
        self._index: Any = None
        self._encoder: EncoderPool | None = None
        self.tuning: dict[str, Any] | None = None  # the encoder auto-tuning report (GET /)
        self.encoder_seconds: float = 0.0  # model load (the first one also imports torch/transformers)
        self.tuning_seconds: float = 0.0  # encoder export/gate/auto-tune (cached after the first start)

    def _started(self) -> bool:
        return self._index is not None

    def _load(self) -> None:
        import faiss

        from searchrl.retrieval.encoders.encoder import Encoder
        from searchrl.retrieval.encoders.tuning import serving_encoder

        encoder: Encoder | None = None

        def load_encoder() -> Encoder:
            nonlocal encoder
            if encoder is None:
                # fp32 torch on CPU: the reference the index is built with and the gate compares against;
                # bf16/int8 variants are derived from it by retrieval/encoders/tuning.py (issue 14)
                cpu_variant = self.settings.precision in ("bf16", "int8")
                base = self.settings.with_changes(**{"precision": "fp32"}) if cpu_variant else self.settings
                encoder = Encoder.from_settings(base)
            return encoder

        # Reuse one loaded model for a first-use build and for serving.
        index_dir = ensure_index(self.settings, "dense", encoder_factory=load_encoder)
        started = time.perf_counter()
        corpus_path, manifest = self._checked_manifest(index_dir)
        encoder_started = time.perf_counter()
        encoder = load_encoder()
        self.encoder_seconds = time.perf_counter() - encoder_started
        verify_manifest(manifest, index_dir, kind="dense", encoder=encoder.spec)
        if self.settings.threads > 0:
            faiss.omp_set_num_threads(self.settings.threads)
        index = read_faiss_index(index_dir / FAISS_FILE)
        self._apply_search_params(index)
        store = DocStore.open(corpus_path, index_dir / OFFSETS)
        for count in (int(index.ntotal), len(store)):
            verify_manifest(manifest, index_dir, kind="dense", count=count)
        if int(index.d) != encoder.dim:
            raise IndexLoadError(
                f"dim differs: FAISS index at {index_dir} has dim {index.d}, encoder gives {encoder.dim}"
            )
        if encoder.device.startswith("cuda"):
            index = self._to_gpu(index)
        # Backend, precision, workers, threads and forward batch measured on this machine (issue 14).
        tuning_started = time.perf_counter()
        self._encoder, self.tuning = serving_encoder(
            self.settings, encoder, index, index_dir, manifest.fingerprint(), corpus_path
        )
        self._index, self._store = index, store
        self.manifest, self.index_dir = manifest, index_dir
        self.tuning_seconds = time.perf_counter() - tuning_started
        # Tuning built, measured and dropped several encoder candidates; their freed buffers stay in the malloc
        # arenas until trimmed (178 MB of 691 MB anonymous memory on the bundled corpus, issue 24).
        trim_heap()
        self.open_seconds = time.perf_counter() - started - self.encoder_seconds - self.tuning_seconds
        log.info(
            "dense backend ready: %d passages, %s, encoder %s %s (index opened in %.3fs, encoder in %.2fs, "
            "tuned in %.2fs)",
            len(store),
            manifest.index_type,
            encoder.spec.name,
            self._encoder.describe(),
            self.open_seconds,
            self.encoder_seconds,
            self.tuning_seconds,
        )

    def _apply_search_params(self, index: Any) -> None:
        """nprobe / efSearch from settings, for index types that have them."""
        import faiss

        try:
            params = faiss.ParameterSpace()
            names = {"nprobe": self.settings.nprobe, "efSearch": self.settings.ef_search}
            for name, value in names.items():
                try:
                    params.set_index_parameter(index, name, value)
                except RuntimeError:
                    pass  # not applicable to this index type (e.g. Flat)
        except AttributeError:  # pragma: no cover - very old faiss
            pass

    @staticmethod
    def _to_gpu(index: Any) -> Any:
        import faiss

        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
            log.info("faiss has no GPU support here; searching the index on CPU")
            return index
        resources = faiss.StandardGpuResources()
        options = faiss.GpuClonerOptions()
        options.useFloat16 = True  # halves GPU memory; recall loss is negligible for normalised vectors
        return faiss.index_cpu_to_gpu(resources, 0, index, options)

    def _search_batch(self, queries: list[str], topk: int) -> list[list[ScoredDocument]]:
        """Encode and search a batch of queries; must run on the worker thread."""
        assert self._encoder is not None and self._store is not None
        vectors = self._encoder.encode_queries(queries)
        k = min(topk, int(self._index.ntotal))
        scores, rows = self._index.search(vectors, k)
        return self._store.hits(rows.tolist(), scores.tolist())

    def info(self) -> dict[str, Any]:
        enc = self._encoder
        return {
            **self._index_info(
                index_type=self.manifest.index_type if self.manifest else self.settings.index_type,
                encoder=enc.spec.name if enc else self.settings.encoder,
                dim=enc.dim if enc else None,
                device=enc.device if enc else None,
            ),
            **(enc.describe() if enc else {}),
            # a converted index's recall@3 against the Flat index it came from (retrieval/index/convert.py); None otherwise
            "index_recall": self.manifest.recall if self.manifest else None,
            "encoder_tuning": self.tuning,
        }

    async def close(self) -> None:
        await super().close()
        self._index = None
        if self._encoder is not None:
            self._encoder.close()
        self._encoder = None


__all__ = ["DenseBackend"]
