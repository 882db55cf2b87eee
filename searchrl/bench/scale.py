"""`searchrl index scale`: IVF-SQ8 measured at growing N (768 dims), and the cost curve docs/sizing.md's 21M row uses.

    searchrl index scale                                   # 250k, 500k, 1M, 2M vectors; nprobe 32, 64, 128
    searchrl index scale --sizes 100k,200k --nprobe 16,32 --queries 100   # a quick look

Why: the wiki-18 row (21M e5-base-v2 vectors, IVF16384,SQ8) was extrapolated from 300k vectors of 384 dims. This
measures the same index type at the largest scale one machine holds and fits the model the row uses,

    ms per query (one core) = a + b * bytes scanned (nprobe * N/nlist * d) + c * coarse quantizer (nlist * d),

then predicts 21M/16384 lists. The uncertainty is shown, not assumed: the fit without the largest size predicts the
largest, and that error is reported next to the prediction.

Vectors: e5-base-v2 (768 dims) cannot be downloaded here, so the bundled corpus's MiniLM passage vectors are
mapped into 768 dims by a random orthonormal map (inner products unchanged: the cluster structure IVF exploits is
the real one), then each synthetic vector is a mapped passage vector plus Gaussian noise, renormalised (cosine ~0.8
to its source, as `searchrl index eval --synthetic`). Bytes scanned, memory and build time are those of 768-dim
vectors; recall is indicative for real e5 vectors (see docs/sizing.md). Queries are the held-out bench queries,
encoded and mapped the same way, never used for training.

Search times are one query per call on one core (`omp_set_num_threads(1)`), as the service's batcher hands FAISS
small batches: q/s per core = 1000 / ms. A replica with more cores multiplies it if memory bandwidth keeps up.
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

from searchrl.bench.index_eval import _rss_bytes, auto_nlist, build_index, corpus_vectors, recall_at
from searchrl.errors import ConfigError
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as index_eval: spinning OpenMP threads distort timings

DEFAULT_SIZES = (250_000, 500_000, 1_000_000, 2_000_000)
DEFAULT_NPROBES = (32, 64, 128)
WIKI18_N = 21_015_324  # passages in Search-R1's wiki-18 corpus
WIKI18_NLIST = 16_384  # docs/sizing.md's recommended IVF16384,SQ8
DIM = 768  # e5-base-v2


@dataclass
class ScalePoint:
    """One (N, nprobe) measurement."""

    n: int
    nlist: int
    nprobe: int
    recall: float  # recall@k against exact inner-product search
    ms_per_query: float  # one query per call, one thread
    scanned_bytes: float  # nprobe * N/nlist * d: the codes one query reads
    coarse_bytes: float  # nlist * d * 4: the centroids every query is compared with

    @property
    def qps_per_core(self) -> float:
        return 1000.0 / self.ms_per_query if self.ms_per_query > 0 else math.inf


@dataclass
class ScaleBuild:
    """One size: what building and holding IVF{nlist},SQ8 cost."""

    n: int
    nlist: int
    train_sample: int
    build_s: float
    index_bytes: int  # on disk = in memory when warm (FAISS keeps one layout)
    rss_growth_bytes: int  # this process's RSS growth while building (check on index_bytes, plus buffers)


def parse_sizes(text: str) -> tuple[int, ...]:
    """'250k,1M,2000000' -> (250000, 1000000, 2000000), ascending; exit-2 message on anything else."""
    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1], 1)
        try:
            value = int(float(part[:-1] if scale > 1 else part) * scale)
        except ValueError:
            raise ConfigError(f"--sizes: {part!r} is not a count such as 250k, 1M or 2000000") from None
        if value < 1_000:
            raise ConfigError(f"--sizes: {part!r} is too small for IVF (at least 1k vectors)")
        out.append(value)
    if not out:
        raise ConfigError("--sizes is empty: give counts such as 250k,500k,1M,2M")
    return tuple(sorted(set(out)))


def widen(x: np.ndarray, dim: int, *, seed: int = 7) -> np.ndarray:
    """x (n, d0) into dim >= d0 dims by a fixed random orthonormal map: norms and inner products are unchanged."""
    d0 = x.shape[1]
    if dim < d0:
        raise ConfigError(f"--dim {dim} is below the encoder's {d0} dims")
    if dim == d0:
        return np.ascontiguousarray(x, dtype=np.float32)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, d0)))
    return np.ascontiguousarray(x @ q.T.astype(np.float32), dtype=np.float32)


def synthetic(base: np.ndarray, n: int, *, seed: int = 1) -> np.ndarray:
    """n unit vectors around rows of base (already widened): noise scaled so cosine to the source stays ~0.8."""
    noise = 0.035 * math.sqrt(384 / base.shape[1])  # index_eval's 0.035 at 384 dims, same total noise energy
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    step = 65_536
    for start in tqdm(range(0, n, step), desc=f"vectors ({n:,})", unit="chunk", leave=False):
        m = min(step, n - start)
        v = base[rng.integers(0, len(base), size=m)] + rng.normal(0.0, noise, size=(m, base.shape[1])).astype(
            np.float32
        )
        out[start : start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def time_search(index: Any, xq: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """ms per query, one query per call (after one warm-up pass over the probed lists), and the ids found."""
    index.search(xq, k)  # touch the lists these queries probe
    found = np.empty((len(xq), k), dtype=np.int64)
    started = time.perf_counter()
    for i in range(len(xq)):
        _, ids = index.search(xq[i : i + 1], k)
        found[i] = ids[0]
    return 1000.0 * (time.perf_counter() - started) / len(xq), found


def fit_nonnegative(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of y on the given columns (each cost term is a count times a non-negative rate).

    Non-negative because none of the costs can be below zero: with plain least squares, timings taken on cores
    shared with other work once fitted a negative intercept and predicted -18.1 ms a wiki-18 query. The columns
    are scaled to 1 before the fit (bytes are ~1e7, an intercept 1), so the solver sees them alike. Shared by
    `fit_cost` here and the conversion benchmark (searchrl/bench/convert.py).
    """
    from scipy.optimize import nnls

    design = np.column_stack(columns).astype(float)
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(design / scale, np.asarray(y, dtype=float))
    return np.asarray(coef / scale)


def fit_cost(points: list[ScalePoint]) -> np.ndarray:
    """(a, b, c) of ms = a + b * scanned_bytes + c * coarse_bytes, non-negative (`fit_nonnegative`); c = 0 when
    nlist never varies."""
    scanned = np.array([p.scanned_bytes for p in points], dtype=float)
    coarse = np.array([p.coarse_bytes for p in points], dtype=float)
    ms = np.array([p.ms_per_query for p in points], dtype=float)
    columns = [np.ones_like(ms), scanned] + ([coarse] if len(set(coarse.tolist())) > 1 else [])
    coef = fit_nonnegative(columns, ms)
    return np.asarray(coef if len(coef) == 3 else [coef[0], coef[1], 0.0])


def predict_ms(coef: np.ndarray, n: int, nlist: int, nprobe: int, dim: int = DIM) -> float:
    return float(coef[0] + coef[1] * nprobe * n / nlist * dim + coef[2] * nlist * dim * 4)


def run_scale(
    settings: RetrievalSettings,
    *,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    nprobes: tuple[int, ...] = DEFAULT_NPROBES,
    n_queries: int = 200,
    k: int = 3,
    dim: int = DIM,
    out_dir: Path = Path("outputs/bench"),
) -> dict[str, Any]:
    """Build IVF{nlist},SQ8 at each size, measure recall and one-core search at each nprobe, fit, predict 21M."""
    import faiss

    from searchrl.retrieval.encoders.tuning import cpu_info
    from searchrl.retrieval.queries import sample_queries

    if not nprobes or min(nprobes) < 1:
        raise ConfigError("--nprobe: give positive list counts such as 32,64,128")
    _check_memory(max(sizes), dim)
    started = time.perf_counter()
    xb0, encoder, corpus_path = corpus_vectors(settings)
    queries = sample_queries(corpus_path)[:n_queries]
    xq = widen(encoder.encode_queries(queries), dim)
    xb_all = synthetic(widen(xb0, dim), max(sizes))
    builds: list[ScaleBuild] = []
    points: list[ScalePoint] = []
    threads = faiss.omp_get_max_threads()
    with tempfile.TemporaryDirectory() as tmp:
        for n in tqdm(sizes, desc="scale", unit="size"):
            # a prefix of a random draw is a random draw: one set of vectors for all sizes
            build, measured = _measure_size(xb_all[:n], xq, k, nprobes, threads, Path(tmp))
            builds.append(build)
            points.extend(measured)
    faiss.omp_set_num_threads(threads)
    coef = fit_cost(points)
    report = {
        "source": f"synthetic around {corpus_path.name} ({len(xb0)} passages, {encoder.spec.name}), "
        f"widened to {dim} dims",
        "dim": dim,
        "k": k,
        "queries": int(len(xq)),
        "cpu": cpu_info()["model"],  # benchmark numbers always name their CPU
        "threads_for_build": threads,
        "builds": [asdict(b) for b in builds],
        "points": [{**asdict(p), "qps_per_core": p.qps_per_core} for p in points],
        "fit": {
            "a_ms": float(coef[0]),
            "b_ms_per_byte": float(coef[1]),
            "c_ms_per_coarse_byte": float(coef[2]),
        },
        "holdout_check": _holdout_check(points, dim),
        "wiki18": _wiki18_estimate(coef, builds, nprobes, dim),
        "seconds": time.perf_counter() - started,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"index-scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report["path"] = str(path)
    return report


def _check_memory(largest: int, dim: int) -> None:
    """Refuse sizes this machine cannot hold before minutes of encoding, not in the middle of a build."""
    need = largest * dim * 4 * 1.6  # the vectors, the index (d + 8 B each) and search buffers
    avail = available_bytes()
    if avail and need > avail:
        raise ConfigError(
            f"--sizes up to {largest:,} x {dim} dims need ~{need / 1e9:.1f} GB of RAM, {avail / 1e9:.1f} GB "
            "are free: give smaller --sizes"
        )


def _measure_size(
    xb: np.ndarray, xq: np.ndarray, k: int, nprobes: tuple[int, ...], threads: int, tmp: Path
) -> tuple[ScaleBuild, list[ScalePoint]]:
    """One size: build IVF{nlist},SQ8 on `threads` threads, then recall and one-core search time per nprobe."""
    import faiss

    n, dim = xb.shape
    faiss.omp_set_num_threads(threads)
    _, truth = faiss.knn(xq, xb, k, metric=faiss.METRIC_INNER_PRODUCT)
    nlist = auto_nlist(n)
    sample = min(n, 64 * nlist)
    rss0 = _rss_bytes()
    index, build_s = build_index(f"IVF{nlist},SQ8", xb, train_sample=sample)
    rss_growth = max(0, _rss_bytes() - rss0)
    path = tmp / "index.faiss"
    faiss.write_index(index, str(path))
    build = ScaleBuild(n, nlist, sample, build_s, path.stat().st_size, rss_growth)
    path.unlink()
    faiss.omp_set_num_threads(1)
    points = []
    for nprobe in nprobes:
        index.nprobe = nprobe
        ms, found = time_search(index, xq, k)
        points.append(
            ScalePoint(
                n=n,
                nlist=nlist,
                nprobe=nprobe,
                recall=recall_at(found, truth, k),
                ms_per_query=ms,
                scanned_bytes=nprobe * n / nlist * dim,
                coarse_bytes=nlist * dim * 4.0,
            )
        )
    return build, points


def _holdout_check(points: list[ScalePoint], dim: int = DIM) -> list[dict[str, Any]]:
    """How far off the curve is one step ahead: fit without the largest size, predict it (needs 2 smaller)."""
    largest = max(p.n for p in points)
    smaller = [p for p in points if p.n < largest]
    check: list[dict[str, Any]] = []
    if len({p.n for p in smaller}) >= 2:
        held = fit_cost(smaller)
        for p in (p for p in points if p.n == largest):
            pred = predict_ms(held, p.n, p.nlist, p.nprobe, dim)
            check.append(
                {"nprobe": p.nprobe, "measured_ms": p.ms_per_query, "predicted_ms": pred,
                 "error": pred / p.ms_per_query - 1.0}
            )  # fmt: skip
    return check


def _wiki18_estimate(
    coef: np.ndarray, builds: list[ScaleBuild], nprobes: tuple[int, ...], dim: int = DIM
) -> dict[str, Any]:
    """The 21M row: index bytes from the largest build's bytes per vector, search ms from the fitted curve."""
    search = []
    for nprobe in nprobes:
        ms = predict_ms(coef, WIKI18_N, WIKI18_NLIST, nprobe, dim)
        search.append({"nprobe": nprobe, "ms_per_query": ms, "qps_per_core": 1000.0 / ms})
    per_byte = builds[-1].index_bytes / builds[-1].n
    return {
        "n": WIKI18_N,
        "nlist": WIKI18_NLIST,
        "index_bytes": int(WIKI18_N * per_byte + (WIKI18_NLIST - builds[-1].nlist) * dim * 4),
        "search": search,
    }


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (free plus reclaimable cache); 0 where unknown (no check then)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table with every column right-aligned (they all hold numbers): header, rule, one line a row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---:|" * len(header),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def format_scale(report: dict[str, Any]) -> str:
    """Markdown: builds, measurements per (N, nprobe), the hold-out check and the 21M prediction."""
    lines = [
        f"IVF-SQ8 at scale: {report['source']}; {report['queries']} held-out queries, recall@{report['k']} vs "
        f"exact; search one query per call on one core; {report['cpu']}",
        "",
        *_table(
            ["N", "nlist", "train sample", "build s", "index MB", "bytes/vector", "RSS growth MB"],
            [
                [
                    f"{b['n']:,}",
                    b["nlist"],
                    f"{b['train_sample']:,}",
                    f"{b['build_s']:.1f}",
                    f"{b['index_bytes'] / 1e6:.0f}",
                    f"{b['index_bytes'] / b['n']:.1f}",
                    f"{b['rss_growth_bytes'] / 1e6:.0f}",
                ]
                for b in report["builds"]
            ],
        ),
        "",
        *_table(
            ["N", "nprobe", "recall", "ms/query", "q/s per core", "MB scanned"],
            [
                [
                    f"{p['n']:,}",
                    p["nprobe"],
                    f"{p['recall']:.3f}",
                    f"{p['ms_per_query']:.2f}",
                    f"{p['qps_per_core']:.0f}",
                    f"{p['scanned_bytes'] / 1e6:.1f}",
                ]
                for p in report["points"]
            ],
        ),
    ]
    f = report["fit"]
    lines += [
        "",
        f"fit: ms = {f['a_ms']:.3f} + {f['b_ms_per_byte'] * 1e6:.4f} per MB scanned + "
        f"{f['c_ms_per_coarse_byte'] * 1e6:.4f} per MB of centroids",
    ]
    lines += [
        f"hold-out: fit without the largest N predicts nprobe {c['nprobe']} at {c['predicted_ms']:.2f} ms, "
        f"measured {c['measured_ms']:.2f} ms ({c['error']:+.0%})"
        for c in report["holdout_check"]
    ]
    w = report["wiki18"]
    lines += [
        "",
        f"wiki-18 prediction: {w['n']:,} vectors, IVF{w['nlist']},SQ8, index ~{w['index_bytes'] / 1e9:.1f} GB",
        "",
        *_table(
            ["nprobe", "ms/query (one core)", "q/s per core"],
            [[s["nprobe"], f"{s['ms_per_query']:.1f}", f"{s['qps_per_core']:.0f}"] for s in w["search"]],
        ),
    ]
    return "\n".join(lines)


__all__ = [
    "DEFAULT_NPROBES",
    "DEFAULT_SIZES",
    "fit_cost",
    "fit_nonnegative",
    "format_scale",
    "parse_sizes",
    "predict_ms",
    "run_scale",
]
