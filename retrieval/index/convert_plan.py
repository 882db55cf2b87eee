"""What a Flat -> compressed conversion reads and needs, known before any work starts (retrieval/index/convert.py).

The Flat file is opened by its header alone (`FlatFile`: rows are read with pread, so memory holds one chunk at
most); `resolve_source` finds it with its corpus and encoder; `make_plan` sizes the run from the header and the
factory string (arithmetic: docs/sizing.md "Converting"), and `check_resources` refuses it in one line when the
node's memory or disk is short.
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from searchrl.errors import ConfigError, IndexLoadError
from searchrl.retrieval.index.build import (
    FAISS_FILE,
    MANIFEST,
    OFFSETS,
    IndexManifest,
    check_trainable,
    index_dir_for,
    load_manifest,
    min_training_points,
    new_faiss_index,
    resolve_corpus,
    verify_manifest,
)

if TYPE_CHECKING:
    from searchrl.retrieval.encoders.encoder import EncoderSpec
    from searchrl.retrieval.settings import RetrievalSettings

POINTS_PER_LIST = 64  # training vectors per IVF list: FAISS warns below 39 and subsamples above 256
MIN_TRAIN_SAMPLE = 65_536  # SQ/PQ ranges need far fewer, but a sample this size costs nothing
BASE_BYTES = 1_500_000_000  # python, numpy, faiss and torch's libraries once the question encoder has run
SEED = 1234  # the training sample and fallback questions; fixed, so a rerun trains on the same rows
# FAISS's fourcc for a Flat index by metric (faiss/impl/index_write.cpp); only inner product is served
FLAT_FOURCC = {b"IxFI": "inner_product", b"IxF2": "l2", b"IxFl": "other"}


# --- the Flat file, read without FAISS holding it -----------------------------------------------------------------


@dataclass(frozen=True)
class FlatFile:
    """A FAISS Flat index file opened by its header: rows are read with pread, so memory holds one chunk at most.

    Layout (faiss/impl/index_write.cpp, `write_index_header` then the codes vector): fourcc, d (int32), ntotal
    (int64), two unused int64, is_trained (uint8), metric_type (int32), metric_arg (float32, only when
    metric_type > 1), the number of floats (uint64), then ntotal x d float32 row by row.
    """

    path: Path
    dim: int
    count: int
    metric: str
    offset: int  # byte offset of row 0

    @classmethod
    def open(cls, path: Path) -> FlatFile:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                head = f.read(64)
            size = path.stat().st_size
        except OSError as exc:
            raise IndexLoadError(f"cannot read Flat index {path} ({exc.strerror or exc})") from None
        if len(head) < 45 or head[:4] not in FLAT_FOURCC:
            raise IndexLoadError(
                f"{path} is not a FAISS Flat index (starts {head[:4]!r}, not IxFI); convert reads Flat indexes "
                "only, such as `searchrl index download wiki18-e5-index`"
            )
        dim, count = struct.unpack_from("<iq", head, 4)
        metric_type = struct.unpack_from("<i", head, 33)[0]
        pos = 37 + (4 if metric_type > 1 else 0)
        floats = struct.unpack_from("<Q", head, pos)[0]
        offset = pos + 8
        if floats != dim * count or size < offset + floats * 4:
            raise IndexLoadError(
                f"{path} is truncated or damaged: header says {count} x {dim} floats, the file has "
                f"{max(0, size - offset) // 4}; download it again"
            )
        return cls(path, int(dim), int(count), FLAT_FOURCC[head[:4]], offset)

    @property
    def row_bytes(self) -> int:
        return self.dim * 4

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a (stop - start, dim) float32 array (one sequential read)."""
        n = stop - start
        out = np.fromfile(
            self.path, dtype=np.float32, count=n * self.dim, offset=self.offset + start * self.row_bytes
        )
        return out.reshape(n, self.dim)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The given rows (sorted ascending: the disk reads forward), one pread each."""
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(ids.tolist()):
                os.preadv(fd, [memoryview(out[i]).cast("B")], self.offset + row * self.row_bytes)
        finally:
            os.close(fd)
        return out


# --- where the Flat index comes from and where the result goes -----------------------------------------------------


@dataclass
class Source:
    """The Flat index to convert: its file, corpus, encoder, and (from our own folder) offsets and manifest."""

    flat: FlatFile
    corpus_path: Path
    checksum: str
    encoder: EncoderSpec
    offsets: Path | None = None
    manifest: IndexManifest | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": str(self.flat.path), "count": self.flat.count, "dim": self.flat.dim}
        if self.manifest is not None:
            out["fingerprint"] = self.manifest.fingerprint()
            out["source"] = self.manifest.source
        return out


def resolve_source(settings: RetrievalSettings, from_path: Path | None = None) -> Source:
    """The Flat index `settings` name (corpus, encoder, index type Flat), or `from_path`: a Flat index folder
    with our manifest, or a bare FAISS Flat file (Search-R1's `e5_Flat.index`) over `settings.corpus`."""
    from searchrl.retrieval.corpus import corpus_checksum
    from searchrl.retrieval.encoders.encoder import resolve_encoder

    spec = resolve_encoder(settings.encoder)[0]
    corpus_path = resolve_corpus(settings)
    checksum = corpus_checksum(corpus_path)
    if from_path is None:
        flat_settings = settings.with_changes(**{"index_type": "Flat", "index_dir": None})
        from_path = index_dir_for(flat_settings, "dense", corpus_path)
        if not (from_path / MANIFEST).is_file():
            raise IndexLoadError(
                f"no Flat index at {from_path} to convert; fetch it with `searchrl index download "
                f"{'wiki18-e5-index' if settings.corpus == 'wiki18' else settings.corpus}`, or pass --from"
            )
    from_path = Path(from_path)
    if from_path.is_dir():
        manifest = load_manifest(from_path)
        verify_manifest(
            manifest, from_path, kind="dense", corpus_path=corpus_path, checksum=checksum, encoder=spec
        )
        if (manifest.index_type or "").replace(" ", "") != "Flat":
            raise ConfigError(
                f"{from_path} holds a {manifest.index_type} index; convert reads a Flat one (its vectors as they are)"
            )
        flat = FlatFile.open(from_path / FAISS_FILE)
        verify_manifest(manifest, from_path, kind="dense", count=flat.count)
        spec = type(spec)(**{**spec.to_dict(), "dim": manifest.dim})
        return Source(flat, corpus_path, checksum, spec, from_path / OFFSETS, manifest)
    if not from_path.is_file():
        raise ConfigError(f"--from {from_path}: no such file or index folder")
    flat = FlatFile.open(from_path)
    if spec.dim is not None and spec.dim != flat.dim:
        raise IndexLoadError(
            f"dim differs: {from_path} has dim {flat.dim}, encoder {spec.name} gives {spec.dim}"
        )
    spec = type(spec)(**{**spec.to_dict(), "dim": flat.dim})
    return Source(flat, corpus_path, checksum, spec)


# --- the plan: what the run needs, checked before anything starts --------------------------------------------------


def default_train_sample(index_type: str, count: int) -> int:
    """64 vectors per IVF list (or per PQ centroid), at least 65,536, at most every vector."""
    return min(count, max(MIN_TRAIN_SAMPLE, POINTS_PER_LIST * min_training_points(index_type)))


def available_memory() -> tuple[int, str]:
    """(bytes this process may still use, where the figure comes from): MemAvailable, lowered by a cgroup v2 limit."""
    avail, where = 0, "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail, where = int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max" and (not avail or int(limit) - used < avail):
            avail, where = max(0, int(limit) - used), "the cgroup's memory.max"
    except (OSError, ValueError):
        pass
    return avail, where


@dataclass
class ConvertPlan:
    """Sizes of one conversion, from the header and the factory string alone (arithmetic: docs/sizing.md)."""

    index_type: str
    count: int
    dim: int
    nlist: int
    train_sample: int
    chunk: int
    threads: int
    code_bytes: int  # bytes per vector in the result (codes, plus an 8-byte id in IVF lists)
    index_bytes: int  # the result on disk and in memory
    memory_bytes: int  # peak: the largest of training, one chunk, and merging (plus BASE_BYTES)
    disk_bytes: int  # shards + the result + offsets, next to the target
    phases: dict[str, int] = field(default_factory=dict)  # memory per phase

    @property
    def chunks(self) -> int:
        return -(-self.count // self.chunk)

    def lines(self) -> list[str]:
        gb = 1e9
        return [
            f"convert: {self.count:,} x {self.dim} Flat ({self.count * self.dim * 4 / gb:.1f} GB, read once) -> "
            f"{self.index_type}: ~{self.index_bytes / gb:.2f} GB ({self.code_bytes} B/vector)",
            f"convert: train on {self.train_sample:,} vectors ({self.train_sample * self.dim * 4 / gb:.2f} GB), add in "
            f"{self.chunks} chunks of {self.chunk:,}, {self.threads} threads",
            "convert: needs memory ~{:.1f} GB (train {:.1f}, chunk {:.1f}, merge {:.1f}) and disk ~{:.1f} GB".format(
                self.memory_bytes / gb,
                self.phases["train"] / gb,
                self.phases["add"] / gb,
                self.phases["merge"] / gb,
                self.disk_bytes / gb,
            ),
        ]


def code_bytes_per_vector(index: Any) -> tuple[int, int]:
    """(bytes per vector, fixed bytes) of an empty index from a factory string; ConfigError for types convert cannot
    stream (their add is not a concatenation of per-chunk adds, e.g. HNSW's graph)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        fixed = (
            int(ivf.nlist) * int(ivf.d) * 4 * 2
        )  # the centroids, twice: the quantizer and its copy in a shard
        return int(ivf.code_size) + 8, fixed
    codes = (
        faiss.try_extract_index_flat_codes(index) if hasattr(faiss, "try_extract_index_flat_codes") else None
    )
    if codes is None and isinstance(index, faiss.IndexFlatCodes):
        codes = index
    if codes is not None:
        return int(codes.code_size), int(index.d) * 4 * 2
    raise ConfigError(
        f"index type {type(index).__name__} cannot be converted in chunks (its add builds one structure, e.g. a graph); "
        "convert to IVF<n>,SQ8 / IVF<n>,Flat / IVF<n>,PQ<m> / SQ8 / SQfp16 / PQ<m>, or build HNSW with "
        "`searchrl index build`"
    )


def make_plan(
    flat: FlatFile, index_type: str, *, train_sample: int = 0, chunk: int = 262_144, threads: int = 0
) -> tuple[ConvertPlan, Any]:
    """The plan and the empty index it was made from (a bad factory string is a ConfigError here, before work)."""
    import faiss

    index = new_faiss_index(flat.dim, index_type)
    per_vector, fixed = code_bytes_per_vector(index)
    sample = min(flat.count, train_sample or default_train_sample(index_type, flat.count))
    if not index.is_trained:
        check_trainable(index_type, flat.count, sample)
    chunk = min(chunk, flat.count)
    ivf = faiss.try_extract_index_ivf(index)
    nlist = int(ivf.nlist) if ivf is not None else 0
    row = flat.dim * 4
    index_bytes = flat.count * per_vector + fixed
    shard = chunk * per_vector + fixed
    # training: the sample, its residuals (IVF by_residual SQ/PQ train on a copy) and the k-means assignment
    train = int(sample * row * 2.2) + sample * 16 + fixed * 3
    add = (
        chunk * row * 2 + chunk * 16 + shard * 2
    )  # the chunk, its residuals, the shard and its serialisation
    # the whole result, plus slack for lists that grow by reallocation (IVF1024/IVF4096,SQ8 at 2M: 987-993 resident
    # bytes per 776-byte entry, +27%; docs/sizing.md), plus the shard being merged
    merge = int(index_bytes * 1.3) + shard
    phases = {"train": train + BASE_BYTES, "add": add + BASE_BYTES, "merge": merge + BASE_BYTES}
    chunks = -(-flat.count // chunk)
    disk = (flat.count * per_vector + chunks * fixed) + index_bytes + flat.count * 8
    plan = ConvertPlan(
        index_type=index_type,
        count=flat.count,
        dim=flat.dim,
        nlist=nlist,
        train_sample=sample,
        chunk=chunk,
        threads=threads or len(os.sched_getaffinity(0)),
        code_bytes=per_vector,
        index_bytes=index_bytes,
        memory_bytes=max(phases.values()),
        disk_bytes=int(disk),
        phases=phases,
    )
    return plan, index


def check_resources(plan: ConvertPlan, where: Path, *, memory_gb: float = 0.0, already: int = 0) -> None:
    """ConfigError in one line when memory or disk is short, before anything is read or written.

    `already`: bytes a resumed conversion has written (its shards count against the disk it needs, not twice).
    """
    if memory_gb > 0:
        avail, source = int(memory_gb * 1e9), "--memory-gb"
    else:
        avail, source = available_memory()
    if avail and plan.memory_bytes > avail:
        raise ConfigError(
            f"convert to {plan.index_type} needs ~{plan.memory_bytes / 1e9:.1f} GB of memory, {source} allows "
            f"{avail / 1e9:.1f} GB: use a node with more memory (docs/sizing.md), or lower --chunk / --train-sample"
        )
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if plan.disk_bytes - already > free:
        raise ConfigError(
            f"convert to {plan.index_type} needs ~{(plan.disk_bytes - already) / 1e9:.1f} GB more disk under {probe}, "
            f"{free / 1e9:.1f} GB are free: free space or use a bigger --disk-size"
        )


def train_rows(count: int, sample: int, seed: int = SEED) -> np.ndarray:
    """The rows the index is trained on: a seeded uniform sample, sorted (the file is read forward)."""
    if sample >= count:
        return np.arange(count, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(count, size=sample, replace=False))


__all__ = [
    "BASE_BYTES",
    "FLAT_FOURCC",
    "MIN_TRAIN_SAMPLE",
    "POINTS_PER_LIST",
    "SEED",
    "ConvertPlan",
    "FlatFile",
    "Source",
    "available_memory",
    "check_resources",
    "code_bytes_per_vector",
    "default_train_sample",
    "make_plan",
    "resolve_source",
    "train_rows",
]
