"""`searchrl index eval`: compressed FAISS index types against exact (Flat) search, on the same vectors.

    searchrl index eval                                  # bundled corpus: Flat, SQfp16, HNSW32, IVF-Flat/SQ8/PQ
    searchrl index eval --types "HNSW32;IVF{nlist},SQ8" --queries 1000 --k 3
    searchrl index eval --synthetic 1000000              # FAISS sizing on 1M realistic synthetic vectors

For each FAISS factory string it reports recall@k against Flat on held-out queries (queries are never used
for training: IVF/PQ train on passage vectors only), size on disk, memory after loading (RSS growth of this
process), build time (train + add), load time (memory-mapped where FAISS allows it), and search time per query.

Vectors come from the dense Flat index of the configured corpus (built on first use, then `reconstruct_n`),
so every index type sees exactly the vectors the service would. `{nlist}` in a factory string is replaced by
a power of two near 4*sqrt(N), capped so that each list gets at least 39 training points (FAISS's own
warning threshold). `--synthetic N` instead draws N vectors around the real ones (each a real passage vector
plus Gaussian noise, renormalised: cosine ~0.8 to its source), to measure sizes and times at scale; recall
there is indicative only. The method and the extrapolation to wiki-18 are in docs/sizing.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from searchrl.errors import ConfigError
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

# FAISS k-means and search use OpenMP; spinning OpenMP threads collapse when anything else wants the CPU
# (see retrieval/encoders/encoder.py). Must be set before faiss is first imported; an explicit value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_TYPES = ("Flat", "SQfp16", "HNSW32", "IVF{nlist},Flat", "IVF{nlist},SQ8", "IVF{nlist},PQ{pq_m}")


@dataclass
class IndexEval:
    index_type: str  # the factory string as built (placeholders filled in)
    n: int
    dim: int
    recall: dict[str, float]  # "recall@k" -> mean |top-k ∩ Flat top-k| / k
    disk_bytes: int
    memory_bytes: int  # resident when warm: max(file size, measured RSS growth)
    rss_growth_bytes: int  # RSS growth of this process after load + one search (a check)
    build_s: float
    load_s: float
    loaded: str  # mmap | mmap-lists | ram
    search_ms_per_query: float
    nprobe: int | None = None
    ef_search: int | None = None

    @property
    def bytes_per_vector(self) -> float:
        return self.memory_bytes / max(1, self.n)


def auto_nlist(n: int) -> int:
    """A power of two near 4*sqrt(n) with at least 39 training points per list."""
    target = 4 * math.sqrt(n)
    # annotated: typeshed types int ** int as Any (a negative exponent gives a float); this one is >= 0
    nlist: int = 2 ** max(0, round(math.log2(max(1.0, target))))
    while nlist > 1 and n / nlist < 39:
        nlist //= 2
    return max(1, nlist)


def auto_pq_m(dim: int) -> int:
    """PQ sub-quantisers: 8 dimensions each (dim/8 bytes per vector), a divisor of dim."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def fill_placeholders(index_type: str, n: int, dim: int) -> str:
    return index_type.replace("{nlist}", str(auto_nlist(n))).replace("{pq_m}", str(auto_pq_m(dim)))


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere, and memory falls back to disk size)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def apply_search_params(index: Any, nprobe: int, ef_search: int) -> tuple[int | None, int | None]:
    """Set nprobe / efSearch where the index type has them (what the dense backend does at load)."""
    import faiss

    ps = faiss.ParameterSpace()
    applied: list[int | None] = []
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        try:
            ps.set_index_parameter(index, name, value)
            applied.append(value)
        except RuntimeError:
            applied.append(None)
    return applied[0], applied[1]


def read_index(path: Path) -> tuple[Any, str]:
    """Read as `searchrl.retrieval.backends.dense.read_faiss_index` does; returns (index, how it was loaded).

    "mmap": codes memory-mapped (Flat, SQ, HNSW with IO_FLAG_MMAP_IFC); "mmap-lists": IVF inverted lists
    mapped (IO_FLAG_MMAP); "ram": read into memory.
    """
    import faiss

    read_only = faiss.IO_FLAG_READ_ONLY
    attempts = [("mmap-lists", faiss.IO_FLAG_MMAP | read_only)]
    if hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        attempts.insert(0, ("mmap", faiss.IO_FLAG_MMAP | faiss.IO_FLAG_MMAP_IFC | read_only))
    for mode, flags in attempts:
        try:
            return faiss.read_index(str(path), flags), mode
        except RuntimeError:
            continue
    return faiss.read_index(str(path)), "ram"


def build_index(index_type: str, xb: np.ndarray, *, train_sample: int, seed: int = 0) -> tuple[Any, float]:
    """Build `index_type` over xb (inner product), training on a seeded random sample; returns (index, s)."""
    from searchrl.retrieval.index.build import new_faiss_index

    started = time.perf_counter()
    index = new_faiss_index(xb.shape[1], index_type)
    if not index.is_trained:
        rng = np.random.default_rng(seed)
        take = min(len(xb), train_sample)
        sample = xb[np.sort(rng.choice(len(xb), size=take, replace=False))] if take < len(xb) else xb
        index.train(sample)
    index.add(xb)
    return index, time.perf_counter() - started


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean share of the exact top-k a search found: `index convert`'s own measure, one definition."""
    from searchrl.retrieval.index.convert import recall_at_k

    return recall_at_k(found, truth, k)


def evaluate(
    xb: np.ndarray,
    xq: np.ndarray,
    index_types: list[str],
    *,
    ks: tuple[int, ...] = (1, 3, 10),
    train_sample: int = 262_144,
    nprobe: int = 32,
    ef_search: int = 128,
    workdir: Path | None = None,
) -> list[IndexEval]:
    """Build, save, reload and search each index type; recall against exact inner-product search."""
    import faiss

    kmax = max(ks)
    exact = faiss.IndexFlatIP(xb.shape[1])
    exact.add(xb)
    _, truth = exact.search(xq, kmax)
    del exact
    results: list[IndexEval] = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for raw_type in tqdm(index_types, desc="index eval", unit="index"):
            index_type = fill_placeholders(raw_type, len(xb), xb.shape[1])
            index, build_s = build_index(index_type, xb, train_sample=train_sample)
            path = Path(tmp) / "index.faiss"
            faiss.write_index(index, str(path))
            del index
            disk = path.stat().st_size
            rss0 = _rss_bytes()
            t0 = time.perf_counter()
            loaded, mode = read_index(path)
            load_s = time.perf_counter() - t0
            applied_nprobe, applied_ef = apply_search_params(loaded, nprobe, ef_search)
            loaded.search(xq[:8], kmax)  # touch the pages once so mmap'd and in-RAM types compare fairly
            t0 = time.perf_counter()
            _, found = loaded.search(xq, kmax)
            search_ms = 1000 * (time.perf_counter() - t0) / len(xq)
            # Memory when warm: FAISS keeps the same layout in RAM as on disk, so a fully touched index is
            # resident at its file size (mmap'd pages as shared page cache). The RSS growth after loading and
            # one search is kept as a check; it is smaller where a search touches only part of the index
            # (IVF probes nprobe lists) and includes search buffers.
            rss_growth = max(0, _rss_bytes() - rss0) if rss0 else 0
            memory = max(disk, rss_growth)
            results.append(
                IndexEval(
                    index_type=index_type,
                    n=len(xb),
                    dim=int(xb.shape[1]),
                    recall={f"recall@{k}": recall_at(found, truth, k) for k in ks},
                    disk_bytes=disk,
                    memory_bytes=int(memory),
                    rss_growth_bytes=int(rss_growth),
                    build_s=build_s,
                    load_s=load_s,
                    loaded=mode,
                    search_ms_per_query=search_ms,
                    nprobe=applied_nprobe,
                    ef_search=applied_ef,
                )
            )
            del loaded
            path.unlink()
    return results


def synthetic_vectors(base: np.ndarray, n: int, *, noise: float = 0.035, seed: int = 1) -> np.ndarray:
    """n unit vectors drawn around real ones: base[i] + N(0, noise^2 I), renormalised.

    With dim 384 and noise 0.035 each synthetic vector keeps cosine ~0.8 to its source, so the data keeps
    the real embeddings' cluster structure (what IVF and PQ exploit) instead of uniform random directions
    (on which every approximate index looks far worse than it is on text).
    """
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    step = 65_536
    for start in range(0, n, step):
        m = min(step, n - start)
        src = base[rng.integers(0, len(base), size=m)]
        v = src + rng.normal(0.0, noise, size=src.shape).astype(np.float32)
        out[start : start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def corpus_vectors(settings: RetrievalSettings) -> tuple[np.ndarray, Any, Path]:
    """(passage vectors from the Flat index, a loaded query encoder, corpus path); builds Flat if missing."""
    import faiss

    from searchrl.retrieval.encoders.encoder import Encoder
    from searchrl.retrieval.index.build import FAISS_FILE, ensure_index, resolve_corpus

    flat_settings = settings.with_changes(**{"index_type": "Flat", "backend": "dense"})
    encoder = Encoder.from_settings(flat_settings)
    index_dir = ensure_index(flat_settings, "dense", encoder_factory=lambda: encoder)
    flat = faiss.read_index(str(index_dir / FAISS_FILE))
    xb = flat.reconstruct_n(0, flat.ntotal)
    return np.ascontiguousarray(xb, dtype=np.float32), encoder, resolve_corpus(flat_settings)


def run_index_eval(
    settings: RetrievalSettings,
    *,
    index_types: list[str] | None = None,
    n_queries: int = 1000,
    ks: tuple[int, ...] = (1, 3, 10),
    synthetic: int = 0,
    train_sample: int | None = None,
    out_dir: Path = Path("outputs/bench"),
) -> dict[str, Any]:
    """The whole `searchrl index eval` run; writes JSON under out_dir and returns it."""
    from searchrl.retrieval.queries import sample_queries as bench_queries

    types = list(index_types or DEFAULT_TYPES)
    if not types:
        raise ConfigError("--types is empty: give FAISS factory strings such as 'HNSW32;IVF{nlist},SQ8'")
    xb, encoder, corpus_path = corpus_vectors(settings)
    # Held-out queries: QA questions and title/sentence queries, never seen by index training.
    queries = bench_queries(corpus_path)[:n_queries]
    xq = encoder.encode_queries(queries)
    source = f"{corpus_path.name} ({len(xb)} passages, {encoder.spec.name})"
    if synthetic:
        xb = synthetic_vectors(xb, synthetic)
        source = f"synthetic: {synthetic} vectors around {source}"
    sample = train_sample if train_sample is not None else getattr(settings, "train_sample", 262_144)
    started = time.perf_counter()
    results = evaluate(
        xb, xq, types, ks=ks, train_sample=sample, nprobe=settings.nprobe, ef_search=settings.ef_search
    )
    flat = next((r for r in results if r.index_type == "Flat"), None)
    flat_bytes = flat.memory_bytes if flat else xb.shape[0] * xb.shape[1] * 4
    report = {
        "source": source,
        "n": int(xb.shape[0]),
        "dim": int(xb.shape[1]),
        "queries": int(len(xq)),
        "train_sample": sample,
        "nprobe": settings.nprobe,
        "ef_search": settings.ef_search,
        "seconds": time.perf_counter() - started,
        "flat_memory_bytes": flat_bytes,
        "results": [
            {
                **asdict(r),
                "bytes_per_vector": r.bytes_per_vector,
                "memory_vs_flat": r.memory_bytes / flat_bytes,
            }
            for r in results
        ],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = (
        out_dir
        / f"index-eval-{'synthetic-' + str(synthetic) if synthetic else 'corpus'}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report["path"] = str(path)
    return report


def format_index_eval(report: dict[str, Any]) -> str:
    ks = [k for k in report["results"][0]["recall"]] if report["results"] else []
    head = f"{'index type':22} " + " ".join(f"{k:>10}" for k in ks)
    head += f" {'memory MB':>10} {'RSS+ MB':>8} {'vs Flat':>8} {'B/vec':>7} {'disk MB':>9} {'build s':>8} {'load ms':>8} {'loaded':>10} {'ms/query':>9}"
    lines = [
        f"{report['source']}; {report['queries']} held-out queries; nprobe={report['nprobe']} efSearch={report['ef_search']}",
        head,
        "-" * len(head),
    ]
    for r in report["results"]:
        rec = " ".join(f"{r['recall'][k]:10.3f}" for k in ks)
        lines.append(
            f"{r['index_type']:22} {rec} {r['memory_bytes'] / 1e6:10.1f} {r['rss_growth_bytes'] / 1e6:8.1f} {100 * r['memory_vs_flat']:7.0f}% "
            f"{r['bytes_per_vector']:7.0f} {r['disk_bytes'] / 1e6:9.1f} {r['build_s']:8.2f} {1000 * r['load_s']:8.1f} "
            f"{r['loaded']:>10} {r['search_ms_per_query']:9.3f}"
        )
    lines.append(f"results: {report['path']}")
    return "\n".join(lines)


__all__ = ["DEFAULT_TYPES", "IndexEval", "auto_nlist", "evaluate", "format_index_eval", "run_index_eval"]
