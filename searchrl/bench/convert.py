"""`searchrl index convert-bench`: `searchrl index convert` on a 2M x 768 Flat file here, and its fit to wiki-18.

    searchrl index convert-bench                               # 2M vectors; SQ8, IVF1024,SQ8, IVF{nlist},SQ8
    searchrl index convert-bench --n 200k --types "SQ8;IVF256,SQ8"   # a quick look

What it measures (issue 48): a synthetic Flat index is written to disk (the FAISS file format `searchrl index
download wiki18-e5-index` gives), then each variant is converted with the same code the CLI runs
(retrieval/index/convert.py `convert_flat`): seconds per phase, peak RSS per phase (VmHWM, reset between phases),
recall@3 against exact search over the Flat file, and the index size. `{nlist}` is filled as `searchrl index
eval` fills it (a power of two near 4*sqrt(N): 4096 at 2M).

Vectors: as `searchrl index scale` (searchrl/bench/scale.py, same `widen` and `synthetic`): real MiniLM passage
vectors of the bundled corpus (the first `--base` passages, truncated to 64 tokens so that encoding them stays
cheap on 2 cores) mapped into 768 dims by a random orthonormal map, each synthetic vector a mapped passage plus
Gaussian noise (cosine ~0.8 to its source). Questions: the bundled dev questions plus corpus-derived ones, encoded
and mapped the same way. Recall is indicative for real e5 vectors; times and bytes are those of 768-dim vectors.

The fit (`fit_nonnegative`, the non-negative least squares `searchrl index scale` uses), in CPU seconds of all
threads (process_time: what the cores did, not how long this shared machine made us wait), over every chunk:
    add seconds per chunk   = a * rows*d + b * rows*nlist*d        (read + SQ encode + truth top-3; coarse assignment)
    train seconds           = t0 + c * sample*nlist*d              (k-means; SQ ranges are in t0)
    merge RSS after a shard = m0 + m1 * vectors merged              (the index in memory, reallocation slack included)
and the ESTIMATE for wiki-18 (21,015,324 x 768, IVF16384,SQ8, 1,048,576 training vectors) on 16 cores divides the
fitted CPU seconds by 16, as if they scaled linearly (k-means and assignment are BLAS sgemm; the 1-vs-all-threads
check says how well that held here, under whatever else shared the cores) and adds disk time at 125 MB/s and 3,000 IOPS (a cloud disk's baseline; the file here was in
the page cache). It is an estimate: the fit, its residuals and the assumptions are printed with it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from searchrl.bench.index_eval import fill_placeholders
from searchrl.bench.scale import WIKI18_N, WIKI18_NLIST, fit_nonnegative, synthetic, widen
from searchrl.errors import ConfigError
from searchrl.retrieval.settings import RetrievalSettings

if TYPE_CHECKING:
    from searchrl.retrieval.index.convert_plan import FlatFile

log = logging.getLogger(__name__)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as index_eval: spinning OpenMP threads distort timings

DEFAULT_TYPES = ("SQ8", "IVF1024,SQ8", "IVF{nlist},SQ8")
DIM = 768
BASE_TOKENS = 64  # base passages are truncated to this for encoding (the vectors only seed the clusters)
WIKI18_SAMPLE = 64 * WIKI18_NLIST  # convert's default training sample for IVF16384
TARGET_CORES = 16
DISK_MB_S = 125.0  # sequential MB/s of a cloud disk's baseline (gp3; settings.py uses the same figure)
DISK_IOPS = 3_000.0  # random reads per second at that baseline (the training sample is read row by row)


def write_flat(path: Path, base: np.ndarray, n: int, *, block: int = 65_536) -> None:
    """A FAISS IndexFlatIP file of n synthetic vectors around `base`, written block by block (never all in memory).

    The header is FAISS's own (an empty IndexFlatIP of this dim written by faiss), with ntotal and the float count
    patched in; the rows follow as FAISS writes them, so `faiss.read_index` and the converter both read it.
    """
    import faiss

    dim = base.shape[1]
    empty = faiss.IndexFlatIP(dim)
    header = bytearray(faiss.serialize_index(empty).tobytes()[:45])
    header[8:16] = int(n).to_bytes(8, "little")
    header[37:45] = int(n * dim).to_bytes(8, "little")
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        for i, start in enumerate(range(0, n, block)):
            f.write(synthetic(base, min(block, n - start), seed=1 + i).tobytes())
    os.replace(tmp, path)


def base_and_queries(
    settings: RetrievalSettings, n_base: int, n_queries: int
) -> tuple[np.ndarray, np.ndarray]:
    """(base passage vectors, question vectors), MiniLM, both widened to 768 dims by the same map."""
    from searchrl.retrieval.encoders.encoder import Encoder
    from searchrl.retrieval.index.bundled import ensure_bundled_corpus
    from searchrl.retrieval.queries import sample_queries

    corpus = ensure_bundled_corpus(Path(settings.data_dir))
    texts = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["contents"])
            if len(texts) >= n_base:
                break
    encoder = Encoder.load("bundled-minilm", device="cpu", precision="fp32", max_length=BASE_TOKENS)
    xb = np.asarray(encoder.encode_passages(texts), dtype=np.float32)
    xq = np.asarray(encoder.encode_queries(sample_queries(corpus, limit=n_queries)), dtype=np.float32)
    return widen(xb, DIM), widen(xq, DIM)


def _nlist(index_type: str) -> int:
    from searchrl.retrieval.index.build import min_training_points

    return min_training_points(index_type) if "IVF" in index_type else 0


def thread_check(trained_path: Path, x: np.ndarray, threads: int) -> dict[str, float]:
    """Seconds to add the same rows to the same trained index at 1 thread and at `threads`: how far compute here
    scales with cores (the 16-core estimate assumes linear)."""
    import faiss

    out: dict[str, float] = {}
    for t in (1, threads):
        faiss.omp_set_num_threads(t)
        index = faiss.read_index(str(trained_path))
        started = time.perf_counter()
        index.add(x)
        out[f"{t}_threads_s"] = time.perf_counter() - started
    faiss.omp_set_num_threads(threads)
    out["speedup"] = out["1_threads_s"] / out[f"{threads}_threads_s"]
    return out


def run_convert_bench(
    settings: RetrievalSettings,
    *,
    n: int = 2_000_000,
    types: tuple[str, ...] = DEFAULT_TYPES,
    n_base: int = 2_000,
    n_queries: int = 300,
    chunk: int = 262_144,
    workdir: Path = Path("outputs/convert-bench"),
    out_dir: Path = Path("outputs/bench"),
) -> dict[str, Any]:
    """Write the Flat file (reused when already there), convert it to each type, fit, estimate wiki-18."""
    from searchrl.retrieval.encoders.tuning import cpu_info
    from searchrl.retrieval.index.convert_plan import FlatFile

    if not types:
        raise ConfigError("--types is empty: give FAISS factory strings such as 'SQ8;IVF{nlist},SQ8'")
    workdir.mkdir(parents=True, exist_ok=True)
    flat_bytes = _check_disk(workdir, n)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "cpu": cpu_info()["model"],
        "cores": len(os.sched_getaffinity(0)),
        "load_average_at_start": os.getloadavg(),
        "n": n,
        "dim": DIM,
        "chunk": chunk,
        "source": f"synthetic around {n_base} bundled MiniLM passage vectors ({BASE_TOKENS} tokens), widened to {DIM}",
        "variants": [],
    }
    base, xq = base_and_queries(settings, n_base, n_queries)
    flat_path = workdir / f"flat-{n}x{DIM}.index"
    t0 = time.perf_counter()
    if not (flat_path.is_file() and flat_path.stat().st_size == flat_bytes):
        write_flat(flat_path, base, n)
    report["write_flat_s"] = time.perf_counter() - t0
    flat = FlatFile.open(flat_path)
    chunk_points: list[dict[str, float]] = []
    train_points: list[dict[str, float]] = []
    ivf_trained: Path | None = None
    for raw in types:
        index_type = fill_placeholders(raw, n, DIM)
        variant, trained = _convert_variant(settings, flat, index_type, xq, workdir, chunk=chunk)
        nlist = variant["nlist"]
        chunk_points.extend({**c, "nlist": nlist} for c in variant["chunks"])
        train_points.append(
            {"sample": variant["train_sample"], "nlist": nlist, "cpu_s": variant["cpu_seconds"]["train"]}
        )
        report["variants"].append(variant)
        if trained is not None:
            ivf_trained = trained
        _write(report, out_dir)  # a report after every variant: a long run killed late still leaves numbers
        log.info("convert-bench: %s done", index_type)
    if ivf_trained is not None:
        report["thread_check"] = thread_check(
            ivf_trained, flat.read(0, min(n, 65_536)), report["variants"][-1]["threads"]
        )
    report["fit"] = fit_and_estimate(report, chunk_points, train_points)
    report["seconds"] = time.perf_counter() - started
    report["load_average_at_end"] = os.getloadavg()
    report["path"] = str(_write(report, out_dir))
    return report


def _check_disk(workdir: Path, n: int) -> int:
    """The Flat file's size in bytes; refuses, before any encoding, a run whose Flat file and shards (~1.6x the
    file) do not fit under `workdir`."""
    flat_bytes = 45 + n * DIM * 4  # FAISS's header, then n float32 rows
    if shutil.disk_usage(workdir).free < flat_bytes * 1.6:
        raise ConfigError(
            f"--n {n:,}: the Flat file and shards need ~{flat_bytes * 1.6 / 1e9:.1f} GB under {workdir}"
        )
    return flat_bytes


def _convert_variant(
    settings: RetrievalSettings, flat: FlatFile, index_type: str, xq: np.ndarray, workdir: Path, *, chunk: int
) -> tuple[dict[str, Any], Path | None]:
    """Convert the Flat file to `index_type` as `searchrl index convert` does: (what it cost and measured, the
    trained empty index kept for `thread_check` when it is an IVF, else None). Its work directory is removed."""
    import faiss

    from searchrl.retrieval.index.convert import convert_flat, phase_peak
    from searchrl.retrieval.index.convert_plan import make_plan

    plan, empty = make_plan(flat, index_type, chunk=chunk, threads=settings.threads)
    work = workdir / f"work-{index_type.replace(',', '_')}"
    shutil.rmtree(work, ignore_errors=True)
    phase_peak()
    query_label = f"{len(xq)} dev + corpus-derived questions (MiniLM, widened)"
    result = convert_flat(flat, work, plan, empty, lambda: (xq, query_label), nprobe=settings.nprobe)
    out_path = workdir / "converted.faiss"
    faiss.write_index(result.index, str(out_path))
    index_bytes = out_path.stat().st_size
    out_path.unlink()
    nlist = _nlist(index_type)
    recalls = _recall_by_nprobe(result.index, xq, work, plan.chunks) if nlist else {}
    variant = {
        "index_type": index_type,
        "nlist": nlist,
        "train_sample": plan.train_sample,
        "threads": plan.threads,
        "seconds": result.seconds,
        "cpu_seconds": result.cpu_seconds,
        "peak_rss": result.peak_rss,
        "plan_memory": plan.phases,
        "recall@3": result.recall,
        "nprobe": result.nprobe,
        "recall@3_by_nprobe": recalls,
        "index_bytes": index_bytes,
        "plan_index_bytes": plan.index_bytes,
        "chunks": result.chunk_log,
        "merge_rss": result.merge_log,
    }
    kept = None
    if nlist:
        kept = workdir / "trained-last-ivf.faiss"
        shutil.copyfile(work / "trained.faiss", kept)
    del result  # the index goes before its work directory does
    shutil.rmtree(work, ignore_errors=True)
    return variant, kept


def _recall_by_nprobe(index: Any, xq: np.ndarray, work: Path, chunks: int) -> dict[str, float]:
    """recall@3 of an IVF index at nprobe 16 to 128, against the exact top-3 convert_flat left in `work`."""
    from searchrl.retrieval.index.convert import RECALL_K, recall_at_k, set_nprobe

    truth = _truth(work, chunks)
    recalls: dict[str, float] = {}
    for nprobe in (16, 32, 64, 128):
        set_nprobe(index, nprobe)
        _, found = index.search(xq, RECALL_K)
        recalls[str(nprobe)] = recall_at_k(found, truth, RECALL_K)
    return recalls


def _truth(work: Path, chunks: int) -> np.ndarray:
    """The exact top-3 over every chunk, from the truth files convert_flat left in its work directory."""
    from searchrl.retrieval.index.convert import RECALL_K, _merge_topk

    best_d: np.ndarray | None = None
    best_i: np.ndarray | None = None
    for c in range(chunks):
        with np.load(work / f"truth-{c:05d}.npz") as t:
            if best_d is None or best_i is None:
                best_d, best_i = t["d"], t["i"]
            else:
                best_d, best_i = _merge_topk(best_d, best_i, t["d"], t["i"], RECALL_K)
    assert best_i is not None
    return best_i


def fit_and_estimate(
    report: dict[str, Any], chunk_points: list[dict[str, float]], train_points: list[dict[str, float]]
) -> dict[str, Any]:
    """The three fits and the 21M, IVF16384,SQ8, 16-core ESTIMATE (module docstring)."""
    d = float(report["dim"])
    rows = np.array([c["rows"] for c in chunk_points], dtype=float)
    nl = np.array([c["nlist"] for c in chunk_points], dtype=float)
    secs = np.array([c["cpu_s"] for c in chunk_points], dtype=float)
    a, b = fit_nonnegative([rows * d, rows * nl * d], secs)
    pred = a * rows * d + b * rows * nl * d
    add_residual = float(np.max(np.abs(pred / secs - 1.0))) if len(secs) else 0.0
    tr = [p for p in train_points if p["nlist"]]
    # FAISS k-means subsamples to 256 points per centroid (ClusteringParameters.max_points_per_centroid)
    work = np.array([min(p["sample"], 256 * p["nlist"]) * p["nlist"] * d for p in tr], dtype=float)
    ts = np.array([p["cpu_s"] for p in tr], dtype=float)
    t0, c = fit_nonnegative([np.ones_like(work), work], ts) if len(tr) >= 2 else (0.0, float(ts[0] / work[0]))
    ivf = [v for v in report["variants"] if v["nlist"]]
    last = ivf[-1] if ivf else report["variants"][-1]
    merged = np.array([m[0] for m in last["merge_rss"]], dtype=float)
    rss = np.array([m[1] for m in last["merge_rss"]], dtype=float)
    m0, m1 = (
        fit_nonnegative([np.ones_like(merged), merged], rss) if len(merged) >= 2 else (float(rss[-1]), 0.0)
    )
    threads = float(last["threads"])
    scale = 1.0 / TARGET_CORES  # the fits are in CPU seconds (all threads): spread over 16 cores
    n21, nl21, s21 = float(WIKI18_N), float(WIKI18_NLIST), float(WIKI18_SAMPLE)
    merge_s_per_vec = last["cpu_seconds"]["merge"] / report["n"]  # one thread copies: CPU = wall
    est_s = {
        "read_sample_s": s21 / DISK_IOPS,
        "train_s": (t0 + c * s21 * nl21 * d) * scale,
        "add_compute_s": (a * n21 * d + b * n21 * nl21 * d) * scale,
        "read_flat_s": n21 * d * 4 / (DISK_MB_S * 1e6),
        "write_and_read_shards_s": 2 * n21 * (d + 8) / (DISK_MB_S * 1e6),
        "merge_s": merge_s_per_vec * n21,
        "write_index_s": n21 * (d + 8) / (DISK_MB_S * 1e6),
    }
    centroids = (nl21 - float(last["nlist"])) * d * 4
    merge_peak = m0 + m1 * n21 + centroids
    train_rss = float(last["peak_rss"].get("train", 0))
    base_rss = float(last["peak_rss"].get("questions", 0))
    train_peak = base_rss + (train_rss - base_rss) * s21 / max(1.0, float(last["train_sample"]))
    return {
        "add": {"a_s_per_row_dim": a, "b_s_per_row_nlist_dim": b, "max_relative_residual": add_residual,
                "points": len(secs)},
        "train": {"t0_s": t0, "c_s_per_sample_nlist_dim": c, "points": len(tr)},
        "merge_rss": {"m0_bytes": m0, "m1_bytes_per_vector": m1, "points": len(merged)},
        "threads_here": threads,
        "estimate_wiki18_16_cores": {
            "label": "ESTIMATE (fit above, in CPU seconds, spread over 16 cores as if linear; disk at 125 MB/s and "
            "3,000 IOPS)",
            "index_type": f"IVF{WIKI18_NLIST},SQ8",
            "n": WIKI18_N,
            "train_sample": WIKI18_SAMPLE,
            **est_s,
            "total_s": sum(est_s.values()),
            "peak_rss_bytes": max(merge_peak, train_peak),
            "merge_peak_bytes": merge_peak,
            "train_peak_bytes": train_peak,
        },
    }  # fmt: skip


def _write(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = Path(report.get("path") or out_dir / f"convert-bench-{time.strftime('%Y%m%d-%H%M%S')}.json")
    report["path"] = str(path)
    path.write_text(json.dumps(report, indent=2, default=float), encoding="utf-8")
    return path


def format_convert_bench(report: dict[str, Any]) -> str:
    """Markdown: per variant the phases, peak RSS and recall; the thread check; the fit and the wiki-18 estimate."""
    gb = 1e9
    lines = [
        f"convert-bench: {report['n']:,} x {report['dim']} Flat ({report['source']}); {report['cpu']}, "
        f"{report['cores']} cores, load average {report['load_average_at_start'][0]:.1f} at start "
        f"(other work shares these cores); Flat file written in {report['write_flat_s']:.0f} s",
        "",
        "| variant | train sample | questions s | train s | add s | merge s | recall s | peak RSS train / add / "
        "merge GB | plan GB | index GB | recall@3 (nprobe) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for v in report["variants"]:
        s, p = v["seconds"], v["peak_rss"]
        by = ", ".join(f"{r:.3f} ({k})" for k, r in v["recall@3_by_nprobe"].items()) or f"{v['recall@3']:.3f}"
        lines.append(
            f"| {v['index_type']} | {v['train_sample']:,} | {s['questions']:.0f} | {s['train']:.0f} | {s['add']:.0f} | "
            f"{s['merge']:.0f} | {s['recall']:.1f} | {p.get('train', 0) / gb:.2f} / {p.get('add', 0) / gb:.2f} / "
            f"{p.get('merge', 0) / gb:.2f} | {max(v['plan_memory'].values()) / gb:.2f} | {v['index_bytes'] / gb:.2f} | {by} |"
        )
    if "thread_check" in report:
        t = report["thread_check"]
        lines += [
            "",
            f"thread check (65,536 rows into the trained IVF index): speedup {t['speedup']:.2f}x ({t})",
        ]
    f = report.get("fit")
    if f:
        e = f["estimate_wiki18_16_cores"]
        lines += [
            "",
            f"fit (CPU seconds, all threads; {f['threads_here']:.0f} threads here): add per chunk = {f['add']['a_s_per_row_dim']:.3e} "
            f"* rows*d + {f['add']['b_s_per_row_nlist_dim']:.3e} * rows*nlist*d over {f['add']['points']} chunks "
            f"(max residual {f['add']['max_relative_residual']:.0%}); train = {f['train']['t0_s']:.1f} + "
            f"{f['train']['c_s_per_sample_nlist_dim']:.3e} * sample*nlist*d ({f['train']['points']} points); merge RSS = "
            f"{f['merge_rss']['m0_bytes'] / gb:.2f} GB + {f['merge_rss']['m1_bytes_per_vector']:.0f} B * vectors",
            "",
            f"{e['label']}: wiki-18 {e['n']:,} x 768 -> {e['index_type']}, {e['train_sample']:,} training vectors",
            "",
            "| phase | seconds |",
            "|---|---:|",
        ]
        for key in ("read_sample_s", "train_s", "add_compute_s", "read_flat_s", "write_and_read_shards_s",
                    "merge_s", "write_index_s", "total_s"):  # fmt: skip
            lines.append(f"| {key.removesuffix('_s')} | {e[key]:,.0f} |")
        lines += [
            "",
            f"peak memory ESTIMATE: {e['peak_rss_bytes'] / gb:.1f} GB (merge {e['merge_peak_bytes'] / gb:.1f}, "
            f"train {e['train_peak_bytes'] / gb:.1f}); node-hours {e['total_s'] / 3600:.2f}",
        ]
    lines.append(f"results: {report.get('path')}")
    return "\n".join(lines)


__all__ = ["DEFAULT_TYPES", "fit_and_estimate", "format_convert_bench", "run_convert_bench", "write_flat"]
