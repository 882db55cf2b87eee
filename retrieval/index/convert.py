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
  1. plan (convert_plan.py): read the Flat file's header (IxFI: inner product), fill the factory string, and print
     the memory and disk the run needs; refuse (exit 2, one line) when the node has less (MemAvailable, the cgroup
     limit, or `--memory-gb`).
  2. questions (convert_questions.py): a few hundred real questions encoded with the index's own encoder on CPU (Search-R1's NQ+HotpotQA
     train questions for wiki18*, the dev questions plus corpus-derived ones otherwise); passage vectors only as a
     labelled fallback when the encoder cannot load.
  3. train: the coarse quantizer and the SQ ranges on a seeded uniform sample of rows (`convert_train_sample`,
     default 64 per IVF list: 1,048,576 x 768 x 4 B = 3.2 GB), read row by row with pread.
  4. add: the file is read in chunks of `convert_chunk` rows (262,144 x 3 KB = 805 MB), each chunk's codes are
     written as a shard (the trained index plus that chunk, ids given explicitly), and the exact top-3 of every
     question over the chunk is kept for recall: the Flat file is read once.
  5. merge the shards in order (byte-identical to adding everything to one index:
     tests/retrieval/index/test_convert.py), measure recall@3 against the exact top-3 at the service's nprobe, and install the index directory (index.faiss,
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
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from tqdm import tqdm

from searchrl.errors import ConfigError, IndexLoadError
from searchrl.retrieval.heap import trim_heap
from searchrl.retrieval.index.build import (
    FAISS_FILE,
    MANIFEST,
    OFFSETS,
    IndexManifest,
    _now,
    _staged,
    index_dir_for,
    load_manifest,
    write_manifest,
)
from searchrl.retrieval.index.convert_plan import (
    SEED,
    ConvertPlan,
    FlatFile,
    Source,
    check_resources,
    make_plan,
    resolve_source,
    train_rows,
)
from searchrl.retrieval.index.convert_questions import encode_questions

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

DEFAULT_TARGET = "IVF16384,SQ8"  # docs/sizing.md's training index for wiki-18
RECALL_K = 3  # the recipe's top-k (DESIGN.md section 6)
STOP_ENV = "SEARCHRL_CONVERT_KILL_AFTER_CHUNKS"  # tests: SIGKILL this process after N new chunks


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


class _Phases:
    """Seconds, peak RSS (VmHWM, reset between phases) and CPU seconds (all threads) of each phase of a conversion."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        self.cpu: dict[str, float] = {}
        self.cpu_start = time.process_time()

    def wall(self, name: str, started: float) -> None:
        """The wall seconds of phase `name`, begun at `started` (perf_counter)."""
        self.seconds[name] = time.perf_counter() - started

    def measure(self, name: str) -> None:
        """The peak RSS and CPU seconds of phase `name`, which ends here."""
        self.peaks[name] = phase_peak()
        self.cpu[name] = time.process_time() - sum(self.cpu.values()) - self.cpu_start

    def end(self, name: str, started: float) -> None:
        self.wall(name, started)
        self.measure(name)


def _work_settings(flat: FlatFile, plan: ConvertPlan) -> dict[str, Any]:
    """What a work directory is for: a resumed conversion must have been started with exactly these."""
    return {
        "flat": str(flat.path),
        "flat_count": flat.count,
        "flat_dim": flat.dim,
        "flat_bytes": flat.path.stat().st_size,
        "index_type": plan.index_type,
        "train_sample": plan.train_sample,
        "chunk": plan.chunk,
        "seed": SEED,
    }


def _questions(work: Path, queries: Callable[[], tuple[np.ndarray, str]]) -> tuple[np.ndarray, str]:
    """(question vectors, where they come from) saved in `work`; `queries()` computes them first when absent."""
    qpath, qlabel = work / "queries.npz", work / "queries.txt"
    if not qpath.is_file():
        xq, label = queries()
        _atomic_save(qlabel, lambda p: p.write_text(label, encoding="utf-8"))
        _atomic_save(qpath, lambda p: _save_arrays(p, q=xq))
    with np.load(qpath) as saved:
        xq = saved["q"]
    return xq, qlabel.read_text(encoding="utf-8")


def _trained(flat: FlatFile, work: Path, plan: ConvertPlan, empty: Any) -> Any:
    """The trained, still empty index saved in `work`; trained on the plan's sample of rows first when absent."""
    import faiss

    trained_path = work / "trained.faiss"
    if trained_path.is_file():
        return faiss.read_index(str(trained_path))
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
    return trained


def _chunk_rows(flat: FlatFile, plan: ConvertPlan, c: int) -> tuple[int, int]:
    """Rows [start, stop) of chunk `c`."""
    return c * plan.chunk, min(flat.count, (c + 1) * plan.chunk)


def _add_chunk(
    flat: FlatFile, work: Path, plan: ConvertPlan, c: int, xq: np.ndarray, blob: Any, is_ivf: bool
) -> dict[str, float]:
    """Chunk `c` read once: the exact top-k of every question over its rows (truth-NNNNN.npz), then its codes as a
    shard of the trained index `blob` (shard-NNNNN.faiss, written last: a shard on disk is a chunk done). Returns
    its rows, seconds, CPU seconds and read seconds."""
    import faiss

    start, stop = _chunk_rows(flat, plan, c)
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
    _write_index(shard, work / f"shard-{c:05d}.faiss")
    del shard
    return {
        "rows": stop - start,
        "seconds": time.perf_counter() - chunk_started,
        "cpu_s": time.process_time() - chunk_cpu,  # every thread's CPU time: cores busy, not waited
        "read_s": read_s,
    }


def _add_chunks(
    flat: FlatFile, work: Path, plan: ConvertPlan, xq: np.ndarray, blob: Any, is_ivf: bool, progress: bool
) -> tuple[int, list[dict[str, float]]]:
    """Every chunk not yet done in `work`, in order: (chunks found done, the log of each new one)."""
    stop_after = int(os.environ.get(STOP_ENV, "0") or 0)
    done_before = 0
    chunk_log: list[dict[str, float]] = []
    bar = tqdm(
        total=flat.count, desc=f"convert: add to {plan.index_type}", unit="vec", unit_scale=True,
        file=sys.stderr, dynamic_ncols=True, mininterval=1.0, disable=not progress,
    )  # fmt: skip
    with bar:
        for c in range(plan.chunks):
            start, stop = _chunk_rows(flat, plan, c)
            if (work / f"shard-{c:05d}.faiss").is_file():
                done_before += 1
                bar.update(stop - start)
                continue
            entry = _add_chunk(flat, work, plan, c, xq, blob, is_ivf)
            bar.update(stop - start)
            chunk_log.append(entry)
            if stop_after and len(chunk_log) >= stop_after:
                log.warning(
                    "convert: %s=%d reached: killing this process (resume test)", STOP_ENV, stop_after
                )
                os.kill(os.getpid(), signal.SIGKILL)
    return done_before, chunk_log


def _merge_shards(
    index: Any, work: Path, plan: ConvertPlan, n_questions: int, progress: bool
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Merge every shard into `index` in order; returns the exact top-k row ids of every question over all rows
    (from the chunks' truth files) and (vectors merged so far, RSS) after each shard."""
    import faiss

    best_d = np.full((n_questions, 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((n_questions, 0), dtype=np.int64)
    merge_log: list[tuple[int, int]] = []
    for c in tqdm(
        range(plan.chunks), desc="convert: merge", unit="shard", file=sys.stderr, disable=not progress
    ):
        shard = faiss.read_index(str(work / f"shard-{c:05d}.faiss"))
        index.merge_from(shard, 0)
        del shard
        merge_log.append((int(index.ntotal), rss_bytes()))
        with np.load(work / f"truth-{c:05d}.npz") as t:
            best_d, best_i = _merge_topk(best_d, best_i, t["d"], t["i"], RECALL_K)
    return best_i, merge_log


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

    phase_peak()
    faiss.omp_set_num_threads(plan.threads)
    _state(work, _work_settings(flat, plan))
    phases = _Phases()
    started = time.perf_counter()
    xq, query_source = _questions(work, queries)
    phases.end("questions", started)

    started = time.perf_counter()
    trained = _trained(flat, work, plan, empty)
    phases.end("train", started)
    is_ivf = faiss.try_extract_index_ivf(trained) is not None
    blob = faiss.serialize_index(trained)  # a fresh shard per chunk: deserialising beats re-reading the file

    started = time.perf_counter()
    done_before, chunk_log = _add_chunks(flat, work, plan, xq, blob, is_ivf, progress)
    phases.wall("add", started)
    trim_heap()  # chunks and shards freed: the merge then grows from what the process really holds
    phases.measure("add")
    if done_before:
        log.info("convert: resumed: %d of %d chunks were already done", done_before, plan.chunks)

    started = time.perf_counter()
    index = faiss.deserialize_index(blob)
    del blob
    truth, merge_log = _merge_shards(index, work, plan, len(xq), progress)
    if int(index.ntotal) != flat.count:
        raise IndexLoadError(
            f"merged index holds {index.ntotal} vectors, the Flat index {flat.count}: delete {work}"
        )
    phases.end("merge", started)

    started = time.perf_counter()
    applied = set_nprobe(index, nprobe)
    _, found = index.search(xq, RECALL_K)
    recall = recall_at_k(found, truth, RECALL_K)
    phases.end("recall", started)
    return ConvertResult(
        plan=plan,
        recall=recall,
        nprobe=applied,
        queries=len(xq),
        query_source=query_source,
        seconds=phases.seconds,
        resumed_chunks=done_before,
        index=index,
        peak_rss=phases.peaks,
        cpu_seconds=phases.cpu,
        chunk_log=chunk_log,
        merge_log=merge_log,
    )


def work_dir_for(index_dir: Path) -> Path:
    """Where a conversion into `index_dir` keeps its resumable work (next to it: same disk, same rename)."""
    return index_dir.with_name(f".{index_dir.name}.convert")


def _install(
    index_dir: Path, source: Source, plan: ConvertPlan, result: ConvertResult, started: float, *, force: bool
) -> IndexManifest:
    """Install the conversion into `index_dir`: the merged index, the corpus offsets and the manifest (recall,
    converted_from) are staged, then renamed into place at once; returns the manifest."""
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
    return manifest


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
    manifest = _install(index_dir, source, plan, result, started, force=force)
    shutil.rmtree(work, ignore_errors=True)
    log.info(
        "convert: %s ready: %s", index_dir, json.dumps({k: round(v, 1) for k, v in result.seconds.items()})
    )
    return index_dir, manifest, plan


__all__ = [
    "DEFAULT_TARGET",
    "RECALL_K",
    "STOP_ENV",
    "ConvertResult",
    "convert_flat",
    "convert_index",
    "phase_peak",
    "recall_at_k",
    "rss_bytes",
    "set_nprobe",
    "work_dir_for",
]
