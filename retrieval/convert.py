"""Convert a Flat FAISS index into a compressed one (IVF16384,SQ8 by default) on CPU, from its own vectors.

    searchrl index convert --corpus wiki18 --encoder intfloat/e5-base-v2            # the wiki-18 training index
    searchrl index convert --from data/downloads/wiki18-e5-index/e5_Flat.index --corpus wiki18 \
        --encoder intfloat/e5-base-v2 --index-type IVF16384,SQ8                     # Search-R1's bare file

Why: a Flat index stores its vectors as they are, so the IVF index a training service needs (docs/sizing.md: ~40
queries/s per 16-core replica for Flat over 21M passages against ~200 for IVF16384,SQ8) can be trained on a sample
of them and filled from them: no encoder pass over the corpus, no GPU, and recall measured against the Flat index it
came from. Search-R1's published wiki-18 index (`searchrl index download wiki18-e5-index`, 21,015,324 x 768 fp32 =
64.5 GB) holds the exact vectors every paper's numbers come from.

How, never holding all vectors in memory (the numbers are for wiki-18 at the defaults; docs/sizing.md "Converting"):
  1. plan: read the Flat file's header (IxFI: inner product), fill the factory string, and print the memory and
     disk the run needs; refuse (exit 2, one line) when the node has less (MemAvailable, the cgroup limit, or
     `--memory-gb`).
  2. questions: a few hundred real questions encoded with the index's own encoder on CPU (Search-R1's NQ+HotpotQA
     train questions for wiki18*, the dev questions plus corpus-derived ones otherwise); passage vectors only as a
     labelled fallback when the encoder cannot load.
  3. train: the coarse quantizer and the SQ ranges on a seeded uniform sample of rows (`convert_train_sample`,
     default 64 per IVF list: 1,048,576 x 768 x 4 B = 3.2 GB), read row by row with pread.
  4. add: the file is read in chunks of `convert_chunk` rows (262,144 x 3 KB = 805 MB), each chunk's codes are
     written as a shard (the trained index plus that chunk, ids given explicitly), and the exact top-3 of every
     question over the chunk is kept for recall: the Flat file is read once.
  5. merge the shards in order (byte-identical to adding everything to one index: tests/retrieval/test_convert.py),
     measure recall@3 against the exact top-3 at the service's nprobe, and install the index directory (index.faiss,
     offsets.npy, manifest.json with `recall` and `converted_from`) only when recall >= `convert_min_recall`.

Resumable: the work lives in `.<index dir>.convert/` next to the target, and every step's output is renamed into
place when complete (trained.faiss, queries.npy, shard-NNNNN.faiss after truth-NNNNN.npz). A rerun after a kill
skips what is there and gives the same index bytes. A conversion whose recall is too low keeps the work directory,
so a rerun with another `--nprobe` only measures again. The Flat index is only ever read.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from tqdm import tqdm

from searchrl.errors import ConfigError, IndexLoadError, first_line
from searchrl.retrieval.heap import trim_heap
from searchrl.retrieval.indexing import (
    FAISS_FILE,
    MANIFEST,
    NAMED_CORPORA,
    OFFSETS,
    IndexManifest,
    _now,
    _staged,
    check_trainable,
    index_dir_for,
    load_manifest,
    min_training_points,
    new_faiss_index,
    resolve_corpus,
    verify_manifest,
    write_manifest,
)

if TYPE_CHECKING:
    from searchrl.retrieval.encoder import EncoderSpec
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

DEFAULT_TARGET = "IVF16384,SQ8"  # docs/sizing.md's training index for wiki-18
RECALL_K = 3  # the recipe's top-k (DESIGN.md section 6)
POINTS_PER_LIST = 64  # training vectors per IVF list: FAISS warns below 39 and subsamples above 256
MIN_TRAIN_SAMPLE = 65_536  # SQ/PQ ranges need far fewer, but a sample this size costs nothing
BASE_BYTES = 1_500_000_000  # python, numpy, faiss and torch's libraries once the question encoder has run
SEED = 1234  # the training sample and fallback questions; fixed, so a rerun trains on the same rows
QUESTIONS_REPO = "PeterJinGo/nq_hotpotqa_train"  # Search-R1's training questions (NQ + HotpotQA train)
# FAISS's fourcc for a Flat index by metric (faiss/impl/index_write.cpp); only inner product is served
FLAT_FOURCC = {b"IxFI": "inner_product", b"IxF2": "l2", b"IxFl": "other"}
STOP_ENV = "SEARCHRL_CONVERT_KILL_AFTER_CHUNKS"  # tests: SIGKILL this process after N new chunks


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
    from searchrl.retrieval.encoder import resolve_encoder

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


# --- recall questions -----------------------------------------------------------------------------------------------


def question_texts(
    settings: RetrievalSettings, corpus_path: Path, n: int, questions: Path | None
) -> tuple[list[str], str]:
    """(up to n questions, where they come from): a given file, Search-R1's training questions for wiki18*, or the
    dev questions plus corpus-derived ones (retrieval/queries.py)."""
    import random

    if questions is not None:
        texts = _read_questions(questions)
        label = f"questions from {questions.name}"
    elif settings.corpus.strip() in NAMED_CORPORA:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(
                hf_hub_download(repo_id=QUESTIONS_REPO, filename="train.parquet", repo_type="dataset")
            )
            texts = _read_questions(path)
            label = f"Search-R1 NQ+HotpotQA train questions ({QUESTIONS_REPO})"
        except Exception as exc:  # noqa: BLE001 - any download failure falls back to the next source, logged
            log.warning(
                "Search-R1's train questions unavailable (%s); using dev + corpus-derived questions",
                first_line(exc),
            )
            texts, label = [], ""
        if texts:
            rng = random.Random(SEED)
            return rng.sample(texts, min(n, len(texts))), label
    else:
        texts = []
    if not texts:
        from searchrl.retrieval.queries import sample_queries

        texts = sample_queries(corpus_path, limit=n)
        label = "dev questions + questions from corpus titles and sentences (retrieval/queries.py)"
    return texts[:n], label


def _read_questions(path: Path) -> list[str]:
    """The `question` column of a parquet file, or field of a JSONL file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [str(q) for q in pq.read_table(path, columns=["question"]).column("question").to_pylist() if q]
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(str(json.loads(line)["question"]))
    if not out:
        raise ConfigError(f"--questions {path}: no rows with a `question` field")
    return out


def encode_questions(
    settings: RetrievalSettings, source: Source, n: int, questions: Path | None
) -> tuple[np.ndarray, str]:
    """Question vectors from the index's own encoder on CPU (fp32), or passage vectors as a labelled fallback."""
    from searchrl.retrieval.encoder import Encoder

    texts, label = question_texts(settings, source.corpus_path, n, questions)
    try:
        encoder = Encoder.load(
            source.encoder.name, device="cpu", precision="fp32", max_length=settings.encoder_max_length
        )
        vectors = np.ascontiguousarray(encoder.encode_queries(texts), dtype=np.float32)
        del encoder
        return vectors, f"{label}, encoded with {source.encoder.name} on CPU"
    except (OSError, ImportError, ConfigError, ValueError) as exc:
        log.warning(
            "encoder %s unavailable (%s): recall uses passage vectors", source.encoder.name, first_line(exc)
        )
        count = source.flat.count
        rows = np.sort(np.random.default_rng(SEED + 1).choice(count, size=min(n, count), replace=False))
        return source.flat.rows(
            rows
        ), f"passage vectors (FALLBACK: encoder {source.encoder.name} unavailable)"


# --- the conversion itself --------------------------------------------------------------------------------------------


@dataclass
class ConvertResult:
    """What a conversion did: the plan, the recall it measured, and seconds per phase."""

    plan: ConvertPlan
    recall: float
    nprobe: int | None
    queries: int
    query_source: str
    seconds: dict[str, float]
    resumed_chunks: int  # chunks found done in the work directory
    index: Any = None  # the merged index (kept by callers that search it further, e.g. the benchmark)
    peak_rss: dict[str, int] = field(default_factory=dict)  # per phase: VmHWM, reset between phases
    chunk_log: list[dict[str, float]] = field(default_factory=list)  # per chunk: rows, seconds, cpu_s, read_s
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # per phase, all threads (process_time)
    merge_log: list[tuple[int, int]] = field(default_factory=list)  # (vectors merged so far, RSS) per shard

    def recall_record(self) -> dict[str, Any]:
        return {
            f"recall@{RECALL_K}": round(self.recall, 4),
            "k": RECALL_K,
            "nprobe": self.nprobe,
            "queries": self.queries,
            "query_source": self.query_source,
            "against": "the Flat index it was converted from (exact top-k over every vector)",
        }


def _atomic_save(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _save_arrays(path: Path, **arrays: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to the temporary name
        cast(Any, np.savez)(f, **arrays)


def set_nprobe(index: Any, nprobe: int) -> int | None:
    """nprobe where the index type has it (as the dense backend sets it at load); None otherwise."""
    import faiss

    try:
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", nprobe)
    except RuntimeError:
        return None
    return nprobe


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean share of the exact top-k a search found (ids; -1 never matches a real row)."""
    hits = [len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits)) / k if hits else 0.0


def _write_index(index: Any, path: Path) -> None:
    import faiss

    _atomic_save(path, lambda p: faiss.write_index(index, str(p)))


def _state(work: Path, expected: dict[str, Any]) -> None:
    """Record what the work directory is for; refuse to resume work done with other settings."""
    path = work / "state.json"
    if path.is_file():
        found = json.loads(path.read_text(encoding="utf-8"))
        diff = [k for k in expected if found.get(k) != expected[k]]
        if diff:
            k = diff[0]
            raise ConfigError(
                f"{work} holds a conversion started with {k}={found.get(k)!r}, not {expected[k]!r}: rerun with the "
                f"same settings to resume it, or delete {work} to start over"
            )
        return
    work.mkdir(parents=True, exist_ok=True)
    _atomic_save(path, lambda p: p.write_text(json.dumps(expected, indent=2), encoding="utf-8"))


def train_rows(count: int, sample: int, seed: int = SEED) -> np.ndarray:
    """The rows the index is trained on: a seeded uniform sample, sorted (the file is read forward)."""
    if sample >= count:
        return np.arange(count, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(count, size=sample, replace=False))


def _merge_topk(
    best_d: np.ndarray, best_i: np.ndarray, d: np.ndarray, i: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by score (inner product, larger first) of two candidate sets, row by row."""
    all_d = np.concatenate([best_d, d], axis=1)
    all_i = np.concatenate([best_i, i], axis=1)
    order = np.argsort(-all_d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(all_d, order, axis=1), np.take_along_axis(all_i, order, axis=1)


def rss_bytes(key: str = "VmRSS") -> int:
    """This process's resident set (VmRSS) or its peak (VmHWM) from /proc; 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def phase_peak() -> int:
    """The peak RSS since the last call, then reset it (write 5 to clear_refs, Linux 4.0+): a peak per phase."""
    peak = rss_bytes("VmHWM")
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        pass
    return peak


def convert_flat(
    flat: FlatFile,
    work: Path,
    plan: ConvertPlan,
    empty: Any,
    queries: Callable[[], tuple[np.ndarray, str]],
    *,
    nprobe: int = 32,
    progress: bool = True,
) -> ConvertResult:
    """Train, add in chunks (resumable), merge and measure recall; returns the merged index in the result.

    `queries` is called once, and only when `work` has no saved question vectors: a resumed run never loads the
    encoder again.
    """
    import faiss

    seconds: dict[str, float] = {}
    peaks: dict[str, int] = {}
    chunk_log: list[dict[str, float]] = []
    merge_log: list[tuple[int, int]] = []
    phase_peak()
    cpu: dict[str, float] = {}
    faiss.omp_set_num_threads(plan.threads)
    _state(
        work,
        {
            "flat": str(flat.path),
            "flat_count": flat.count,
            "flat_dim": flat.dim,
            "flat_bytes": flat.path.stat().st_size,
            "index_type": plan.index_type,
            "train_sample": plan.train_sample,
            "chunk": plan.chunk,
            "seed": SEED,
        },
    )
    started, cpu_start = time.perf_counter(), time.process_time()
    qpath, qlabel = work / "queries.npz", work / "queries.txt"
    if not qpath.is_file():
        xq, label = queries()
        _atomic_save(qlabel, lambda p: p.write_text(label, encoding="utf-8"))
        _atomic_save(qpath, lambda p: _save_arrays(p, q=xq))
    with np.load(qpath) as saved:
        xq = saved["q"]
    query_source = qlabel.read_text(encoding="utf-8")
    seconds["questions"] = time.perf_counter() - started
    peaks["questions"] = phase_peak()
    cpu["questions"] = time.process_time() - sum(cpu.values()) - cpu_start

    started = time.perf_counter()
    trained_path = work / "trained.faiss"
    if trained_path.is_file():
        trained = faiss.read_index(str(trained_path))
    else:
        trained = empty
        if not trained.is_trained:
            rows = train_rows(flat.count, plan.train_sample)
            log.info("convert: reading %d training vectors", len(rows))
            sample = flat.rows(rows)
            log.info(
                "convert: training %s on %d vectors (%d threads)", plan.index_type, len(sample), plan.threads
            )
            trained.train(sample)
            del sample
            trim_heap()  # the 3.2 GB sample goes back to the OS, not into malloc's arenas (retrieval/heap.py)
        _write_index(trained, trained_path)
    seconds["train"] = time.perf_counter() - started
    peaks["train"] = phase_peak()
    cpu["train"] = time.process_time() - sum(cpu.values()) - cpu_start
    is_ivf = faiss.try_extract_index_ivf(trained) is not None
    blob = faiss.serialize_index(trained)  # a fresh shard per chunk: deserialising beats re-reading the file

    started = time.perf_counter()
    stop_after = int(os.environ.get(STOP_ENV, "0") or 0)
    done_before = 0
    new = 0
    bar = tqdm(
        total=flat.count, desc=f"convert: add to {plan.index_type}", unit="vec", unit_scale=True,
        file=sys.stderr, dynamic_ncols=True, mininterval=1.0, disable=not progress,
    )  # fmt: skip
    with bar:
        for c in range(plan.chunks):
            start, stop = c * plan.chunk, min(flat.count, (c + 1) * plan.chunk)
            shard_path = work / f"shard-{c:05d}.faiss"
            if shard_path.is_file():
                done_before += 1
                bar.update(stop - start)
                continue
            chunk_started, chunk_cpu = time.perf_counter(), time.process_time()
            x = flat.read(start, stop)
            read_s = time.perf_counter() - chunk_started
            d, i = faiss.knn(xq, x, min(RECALL_K, len(x)), metric=faiss.METRIC_INNER_PRODUCT)
            # the exact top-k of every question over this chunk, as row ids
            _atomic_save(work / f"truth-{c:05d}.npz", functools.partial(_save_arrays, d=d, i=i + start))
            shard = faiss.deserialize_index(blob)
            if is_ivf:
                shard.add_with_ids(x, np.arange(start, stop, dtype=np.int64))
            else:
                shard.add(x)
            del x
            _write_index(shard, shard_path)
            del shard
            bar.update(stop - start)
            chunk_log.append(
                {
                    "rows": stop - start,
                    "seconds": time.perf_counter() - chunk_started,
                    "cpu_s": time.process_time()
                    - chunk_cpu,  # every thread's CPU time: cores busy, not waited
                    "read_s": read_s,
                }
            )
            new += 1
            if stop_after and new >= stop_after:
                log.warning(
                    "convert: %s=%d reached: killing this process (resume test)", STOP_ENV, stop_after
                )
                os.kill(os.getpid(), signal.SIGKILL)
    seconds["add"] = time.perf_counter() - started
    trim_heap()  # chunks and shards freed: the merge then grows from what the process really holds
    peaks["add"] = phase_peak()
    cpu["add"] = time.process_time() - sum(cpu.values()) - cpu_start
    if done_before:
        log.info("convert: resumed: %d of %d chunks were already done", done_before, plan.chunks)

    started = time.perf_counter()
    index = faiss.deserialize_index(blob)
    del blob
    best_d = np.full((len(xq), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(xq), 0), dtype=np.int64)
    for c in tqdm(
        range(plan.chunks), desc="convert: merge", unit="shard", file=sys.stderr, disable=not progress
    ):
        shard = faiss.read_index(str(work / f"shard-{c:05d}.faiss"))
        index.merge_from(shard, 0)
        del shard
        merge_log.append((int(index.ntotal), rss_bytes()))
        with np.load(work / f"truth-{c:05d}.npz") as t:
            best_d, best_i = _merge_topk(best_d, best_i, t["d"], t["i"], RECALL_K)
    if int(index.ntotal) != flat.count:
        raise IndexLoadError(
            f"merged index holds {index.ntotal} vectors, the Flat index {flat.count}: delete {work}"
        )
    seconds["merge"] = time.perf_counter() - started
    peaks["merge"] = phase_peak()
    cpu["merge"] = time.process_time() - sum(cpu.values()) - cpu_start

    started = time.perf_counter()
    applied = set_nprobe(index, nprobe)
    _, found = index.search(xq, RECALL_K)
    recall = recall_at_k(found, best_i, RECALL_K)
    seconds["recall"] = time.perf_counter() - started
    peaks["recall"] = phase_peak()
    cpu["recall"] = time.process_time() - sum(cpu.values()) - cpu_start
    return ConvertResult(
        plan=plan,
        recall=recall,
        nprobe=applied,
        queries=len(xq),
        query_source=query_source,
        seconds=seconds,
        resumed_chunks=done_before,
        index=index,
        peak_rss=peaks,
        cpu_seconds=cpu,
        chunk_log=chunk_log,
        merge_log=merge_log,
    )


def work_dir_for(index_dir: Path) -> Path:
    """Where a conversion into `index_dir` keeps its resumable work (next to it: same disk, same rename)."""
    return index_dir.with_name(f".{index_dir.name}.convert")


def convert_index(
    settings: RetrievalSettings,
    *,
    from_path: Path | None = None,
    index_type: str = DEFAULT_TARGET,
    train_sample: int | None = None,
    chunk: int | None = None,
    min_recall: float | None = None,
    n_queries: int | None = None,
    memory_gb: float | None = None,
    questions: Path | None = None,
    force: bool = False,
    plan_only: bool = False,
) -> tuple[Path, IndexManifest | None, ConvertPlan]:
    """`searchrl index convert`: the Flat index -> an index directory of `index_type` the dense backend loads as is.

    Returns (index dir, its manifest, the plan); with `plan_only`, nothing is read past the headers and the
    manifest is None. Recall below `min_recall` is a ConfigError (exit 2) and installs nothing.
    """
    train_sample = settings.convert_train_sample if train_sample is None else train_sample
    chunk = settings.convert_chunk if chunk is None else chunk
    min_recall = settings.convert_min_recall if min_recall is None else min_recall
    n_queries = settings.convert_queries if n_queries is None else n_queries
    memory_gb = settings.convert_memory_gb if memory_gb is None else memory_gb

    source = resolve_source(settings, from_path)
    if source.flat.metric != "inner_product":
        raise ConfigError(
            f"{source.flat.path} is a {source.flat.metric} Flat index; the service searches by inner product "
            "(normalised vectors), so convert reads inner-product (IxFI) indexes only"
        )
    plan, empty = make_plan(
        source.flat, index_type, train_sample=train_sample, chunk=chunk, threads=settings.threads
    )
    target_settings = settings.with_changes(**{"index_type": plan.index_type, "encoder": source.encoder.name})
    index_dir = index_dir_for(target_settings, "dense", source.corpus_path)
    for line in plan.lines():
        log.info("%s", line)
    installed = (index_dir / MANIFEST).is_file() and not force
    if installed and not plan_only:
        log.info("convert: %s already exists (pass --force to convert again)", index_dir)
        return index_dir, load_manifest(index_dir), plan
    work = work_dir_for(index_dir)
    already = sum(p.stat().st_size for p in work.glob("*") if p.is_file()) if work.is_dir() else 0
    check_resources(plan, index_dir.parent, memory_gb=memory_gb, already=already)
    if plan_only:  # the plan and the resource check only, whether or not the index exists
        return index_dir, None, plan

    started = time.perf_counter()
    result = convert_flat(
        source.flat,
        work,
        plan,
        empty,
        lambda: encode_questions(settings, source, n_queries, questions),
        nprobe=settings.nprobe,
    )
    log.info(
        "convert: recall@%d %.3f at nprobe %s on %d questions (%s)",
        RECALL_K, result.recall, result.nprobe, result.queries, result.query_source,
    )  # fmt: skip
    if result.recall < min_recall:
        raise ConfigError(
            f"recall@{RECALL_K} of {plan.index_type} is {result.recall:.3f} at nprobe {result.nprobe}, below "
            f"--min-recall {min_recall:.2f}: nothing installed, the Flat index is untouched; rerun with a higher "
            f"--nprobe (only the measurement runs again, from {work}) or another --index-type"
        )
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    with _staged(index_dir, force=force) as staging:
        import faiss

        faiss.write_index(result.index, str(staging / FAISS_FILE))
        result.index = None
        if source.offsets is not None and source.offsets.is_file():
            shutil.copyfile(source.offsets, staging / OFFSETS)
        else:
            from searchrl.retrieval.corpus import build_offsets

            rows = build_offsets(source.corpus_path, staging / OFFSETS)
            if rows != source.flat.count:
                raise IndexLoadError(
                    f"count differs: {source.flat.path} holds {source.flat.count} vectors but {source.corpus_path} "
                    f"has {rows} passages"
                )
        manifest = IndexManifest(
            kind="dense",
            count=source.flat.count,
            corpus_path=str(source.corpus_path.resolve()),
            corpus_checksum=source.checksum,
            encoder=source.encoder.to_dict(),
            dim=source.flat.dim,
            index_type=plan.index_type,
            metric="inner_product",
            build_seconds=round(time.perf_counter() - started, 2),
            created_at=_now(),
            source="converted",
            recall=result.recall_record(),
            converted_from=source.describe(),
        )
        write_manifest(manifest, staging)
    shutil.rmtree(work, ignore_errors=True)
    log.info(
        "convert: %s ready: %s", index_dir, json.dumps({k: round(v, 1) for k, v in result.seconds.items()})
    )
    return index_dir, manifest, plan


__all__ = [
    "DEFAULT_TARGET",
    "ConvertPlan",
    "ConvertResult",
    "FlatFile",
    "convert_flat",
    "convert_index",
    "make_plan",
    "resolve_source",
    "train_rows",
]
