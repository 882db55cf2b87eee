"""Replica start time from a prebuilt index: copy out of a bucket stand-in, then `searchrl serve` to the first 200.

    searchrl bench start-time                    # bundled bm25 + dense, the 100k E5-shaped stand-in, rates; ~2 min
    make bench-start                             # the same (docs/deploy.md section 6 comes from it)

What a replica does in sky/retrieval.yaml's setup and run when SEARCHRL_INDEX_BUCKET is set, minus the install and
the cloud: (1) `searchrl index copy --from <bucket mount> --to <data dir>` into an empty data dir, (2) `searchrl
serve` launched as `run:` launches it, polled with the readiness probe of sky/retrieval.yaml (POST /ready with its
body and a bearer token) every 0.2 s until the first 200. The "bucket" is a local directory here (no cloud): the
copy rate is this machine's disk, not an object store's.

wiki18-100k cannot be downloaded here (no Hugging Face Hub), so it is NOT served: a stand-in of the same shape
(100,000 passages of bundled text, a 768-dim Flat index of random unit vectors, ~307 MB, manifest naming
intfloat/e5-base-v2) measures the copy and the load-and-first-search part in a fresh interpreter: corpus checksum,
manifest checks, FAISS mmap read, doc store, one Flat search (page cache warm, then cold after
`posix_fadvise(DONTNEED)`). Loading the E5 model (~438 MB of weights) is not measured. The rates (copy MB/s, cold
read MB/s, Flat scan GB/s) are what docs/deploy.md uses for wiki-18 on paper.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import SearchRLError
from searchrl.http import bearer_headers
from searchrl.processes import stop_process
from searchrl.retrieval.process import free_port, serve_command, start_process, wait_until_ready

log = logging.getLogger(__name__)

STANDIN_PASSAGES = 100_000  # wiki-18-100k's row count
STANDIN_DIM = 768  # e5-base-v2
STANDIN_ENCODER = "intfloat/e5-base-v2"
TOKEN = "start-time-bench-token"  # loopback only; a real deployment passes RETRIEVAL_API_KEY as a secret
POLL_S = 0.2


@dataclass
class StartRow:
    """One corpus/backend: seconds of each step a replica takes from an index bucket."""

    corpus: str
    backend: str
    copy_s: float  # `searchrl index copy` from the bucket stand-in into an empty data dir (process start included)
    copy_mb: float
    serve_s: float | None  # `searchrl serve` launch -> first 200 on the probe; None = not served (stand-in)
    load_s: float | None = (
        None  # stand-in only: checksum + manifest + FAISS mmap + doc store, fresh interpreter
    )
    first_search_warm_s: float | None = None  # stand-in only: first Flat search, index in page cache
    first_search_cold_s: float | None = (
        None  # stand-in only: first Flat search after evicting the index pages
    )
    note: str = ""

    @property
    def total_s(self) -> float:
        rest = (
            self.serve_s if self.serve_s is not None else (self.load_s or 0) + (self.first_search_cold_s or 0)
        )
        return self.copy_s + rest


@dataclass
class StartReport:
    cpu: str
    cores: int
    rows: list[StartRow] = field(default_factory=list)
    build_s: dict[str, float] = field(default_factory=dict)  # one-time builds into the bucket (0 = reused)
    sizes_mb: dict[str, float] = field(default_factory=dict)  # index + corpus bytes a replica copies
    rates: dict[str, float] = field(default_factory=dict)  # copy_mb_s, cold_read_mb_s, flat_scan_gb_s


def _searchrl(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchrl", *argv],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _tree_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "encoders" not in p.parts) / 1e6


def _timed_copy(source: Path, dest: Path, corpus: str, backend: str, encoder: str) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    proc = _searchrl(
        "index", "copy", "--from", str(source), "--to", str(dest), "--backend", backend,
        "--corpus", corpus, "--encoder", encoder,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SearchRLError(f"index copy failed: {proc.stderr.strip().splitlines()[-1:]}")
    return seconds


def probe_body() -> tuple[str, dict[str, Any]]:
    """sky/retrieval.yaml's readiness probe path and body, read from the file (what SkyServe sends)."""
    import yaml

    from searchrl.deploy.skypilot import SKY_DIR

    probe = yaml.safe_load((SKY_DIR / "retrieval.yaml").read_text())["service"]["readiness_probe"]
    return str(probe["path"]), dict(probe["post_data"])


def time_to_first_200(data_dir: Path, backend: str, log_path: Path, *, timeout_s: float = 900) -> float:
    """Launch `searchrl serve` as `run:` does and poll the readiness probe every 0.2 s until it answers 200."""
    path, body = probe_body()
    port = free_port()
    args = ["--backend", backend, "--corpus", "bundled", "--data-dir", str(data_dir)]
    started = time.perf_counter()
    proc = start_process(serve_command(args, port), log_path, env={**os.environ, "RETRIEVAL_API_KEY": TOKEN})
    try:
        wait_until_ready(
            f"http://127.0.0.1:{port}",
            proc,
            path=path,
            json=body,
            headers=bearer_headers(TOKEN),
            timeout_s=timeout_s,
            interval_s=POLL_S,
            request_timeout_s=15,
            log_path=log_path,
        )
        return time.perf_counter() - started
    finally:
        stop_process(proc, grace_s=60)


def publish_bundled(work: Path, backend: str) -> tuple[Path, float]:
    """Build (or reuse) the bundled index in work/build and copy it into the bucket stand-in work/bucket."""
    from searchrl.config import load_settings
    from searchrl.retrieval.index.build import MANIFEST, default_index_dir, ensure_index
    from searchrl.retrieval.index.copy import copy_index
    from searchrl.retrieval.settings import RetrievalSettings

    settings = load_settings(RetrievalSettings, corpus="bundled", data_dir=work / "build", backend=backend)
    existed = (default_index_dir(settings, backend) / MANIFEST).is_file()  # type: ignore[arg-type]
    started = time.perf_counter()
    ensure_index(settings, backend)  # type: ignore[arg-type]
    build_s = 0.0 if existed else time.perf_counter() - started
    copy_index(settings, backend, work / "build", work / "bucket", progress=False)  # type: ignore[arg-type]
    return work / "bucket", build_s


def make_standin(work: Path, *, passages: int = STANDIN_PASSAGES, dim: int = STANDIN_DIM) -> Path:
    """A wiki18-100k-shaped data dir: `passages` rows of bundled text, a `dim`-dim Flat index of random unit vectors.

    The index is a real FAISS Flat file imported like the downloaded one (`import_faiss_index`, manifest naming
    intfloat/e5-base-v2): same bytes per row, same load path. Its vectors are noise: it measures I/O and search
    cost, never retrieval quality.
    """
    import faiss
    import numpy as np

    from searchrl.config import load_settings
    from searchrl.retrieval.corpus import Passage, write_jsonl
    from searchrl.retrieval.encoders.encoder import resolve_encoder
    from searchrl.retrieval.index.build import MANIFEST, import_faiss_index, index_dir_for
    from searchrl.retrieval.index.bundled import iter_bundled
    from searchrl.retrieval.index.download import CORPORA
    from searchrl.retrieval.settings import RetrievalSettings

    root = work / "standin-build"
    corpus = root / "corpora" / CORPORA["wiki18-100k"].local_name
    settings = load_settings(
        RetrievalSettings, corpus="wiki18-100k", encoder=STANDIN_ENCODER, data_dir=root, backend="dense"
    )
    if corpus.is_file():
        index_dir = index_dir_for(settings, "dense", corpus)
        if (index_dir / MANIFEST).is_file():
            return root
    bundled = list(iter_bundled())

    def rows() -> Any:
        for i in range(passages):
            p = bundled[i % len(bundled)]
            yield Passage(id=str(i), contents=p.contents)

    corpus.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(rows(), corpus)
    rng = np.random.default_rng(0)
    index = faiss.IndexFlatIP(dim)
    for start in range(0, passages, 20_000):
        block = rng.standard_normal((min(20_000, passages - start), dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        index.add(block)
    raw = root / "downloads" / "e5_Flat-100k.index"
    raw.parent.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(raw))
    index_dir = index_dir_for(settings, "dense", corpus)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    import_faiss_index(raw, corpus, index_dir, resolve_encoder(STANDIN_ENCODER)[0], index_type="Flat")
    return root


def _evict(path: Path) -> None:
    """Drop a file's clean pages from the page cache (no root needed), so the next read comes from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load_and_search(data_dir: str, cold: bool) -> dict[str, float]:
    """The stand-in's load path as the dense backend runs it, minus the encoder; prints JSON (own process)."""
    import numpy as np

    started = time.perf_counter()
    from searchrl.config import load_settings
    from searchrl.retrieval.backends.dense import read_faiss_index
    from searchrl.retrieval.corpus import DocStore
    from searchrl.retrieval.index.build import (
        FAISS_FILE,
        OFFSETS,
        index_dir_for,
        load_manifest,
        resolve_corpus,
        verify_manifest,
    )
    from searchrl.retrieval.settings import RetrievalSettings

    settings = load_settings(
        RetrievalSettings, corpus="wiki18-100k", encoder=STANDIN_ENCODER, data_dir=Path(data_dir)
    )
    corpus = resolve_corpus(settings)  # the local file: nothing is downloaded when it exists
    index_dir = index_dir_for(settings, "dense", corpus)
    if cold:
        for path in (index_dir / FAISS_FILE, corpus):
            _evict(path)
    imported = time.perf_counter()
    manifest = load_manifest(index_dir)
    verify_manifest(manifest, index_dir, kind="dense", corpus_path=corpus)
    index = read_faiss_index(index_dir / FAISS_FILE)
    store = DocStore.open(corpus, index_dir / OFFSETS)
    verify_manifest(manifest, index_dir, kind="dense", count=int(index.ntotal))
    loaded = time.perf_counter()
    query = np.random.default_rng(1).standard_normal((1, int(index.d)), dtype=np.float32)
    scores, rows = index.search(query, 3)
    store.hits(rows.tolist(), scores.tolist())
    first = time.perf_counter()
    index.search(query * -1, 3)
    second = time.perf_counter()
    return {
        "imports_s": imported - started,
        "load_s": loaded - imported,
        "first_search_s": first - loaded,
        "second_search_s": second - first,
        "index_mb": (index_dir / FAISS_FILE).stat().st_size / 1e6,
    }


def _load_in_fresh_process(data_dir: Path, *, cold: bool) -> dict[str, float]:
    code = (
        "import json, sys; from searchrl.bench.start_time import load_and_search; "
        f"print(json.dumps(load_and_search({str(data_dir)!r}, {cold!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SearchRLError(f"stand-in load failed: {proc.stderr.strip().splitlines()[-1:]}")
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def cold_read_mb_s(path: Path) -> float:
    """Sequential read rate of `path` with its pages evicted first: this machine's disk, not a cloud disk."""
    _evict(path)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 * 1024 * 1024)
        while f.readinto(buf):
            pass
    return path.stat().st_size / 1e6 / (time.perf_counter() - started)


def run_start_time(
    work: Path,
    *,
    backends: tuple[str, ...] = ("bm25", "dense"),
    standin: bool = True,
    standin_passages: int = STANDIN_PASSAGES,
) -> StartReport:
    """Measure every row; bundled indexes are built once into work/build (reused on later runs)."""
    from searchrl.retrieval.encoders.tuning import cpu_info

    info = cpu_info()
    report = StartReport(cpu=str(info["model"]), cores=int(info["cores"]))
    work.mkdir(parents=True, exist_ok=True)
    for backend in backends:
        log.info("bundled %s: publishing to the bucket stand-in (builds once)", backend)
        bucket, report.build_s[f"bundled/{backend}"] = publish_bundled(work, backend)
        replica = work / f"replica-{backend}"
        encoder = "bundled-minilm"
        copy_s = _timed_copy(bucket, replica, "bundled", backend, encoder)
        size = _tree_mb(replica)
        report.sizes_mb[f"bundled/{backend}"] = size
        log.info("bundled %s: copied %.1f MB in %.2fs; starting searchrl serve", backend, size, copy_s)
        serve_s = time_to_first_200(replica, backend, work / f"serve-{backend}.log")
        report.rows.append(StartRow("bundled", backend, copy_s, size, serve_s))
        log.info("bundled %s: first 200 after %.2fs", backend, serve_s)
    if standin:
        from searchrl.config import load_settings
        from searchrl.retrieval.index.copy import copy_index
        from searchrl.retrieval.settings import RetrievalSettings

        log.info("wiki18-100k stand-in: %d x %d Flat from random vectors", standin_passages, STANDIN_DIM)
        root = make_standin(work, passages=standin_passages)
        settings = load_settings(RetrievalSettings, corpus="wiki18-100k", encoder=STANDIN_ENCODER)
        copy_index(settings, "dense", root, work / "standin-bucket", progress=False)
        replica = work / "replica-standin"
        copy_s = _timed_copy(work / "standin-bucket", replica, "wiki18-100k", "dense", STANDIN_ENCODER)
        size = _tree_mb(replica)
        warm = _load_in_fresh_process(replica, cold=False)
        cold = _load_in_fresh_process(replica, cold=True)
        report.sizes_mb["wiki18-100k-standin/dense"] = size
        report.rows.append(
            StartRow(
                "wiki18-100k (stand-in)",
                "dense",
                copy_s,
                size,
                None,
                load_s=cold["imports_s"] + cold["load_s"],
                first_search_warm_s=warm["first_search_s"],
                first_search_cold_s=cold["first_search_s"],
                note="E5 model load not measured (~438 MB of weights; no Hub here)",
            )
        )
        index_file = next((replica / "indexes").rglob("index.faiss"))
        report.rates["copy_mb_s"] = size / copy_s
        report.rates["cold_read_mb_s"] = cold_read_mb_s(index_file)
        report.rates["flat_scan_gb_s"] = warm["index_mb"] / 1e3 / max(warm["second_search_s"], 1e-6)
    (work / "start-time.json").write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    return report


def format_report(report: StartReport) -> str:
    """Markdown: one row per corpus/backend, then the rates, naming the CPU."""
    lines = [
        f"Replica start from an index bucket stand-in (local dir), {report.cpu}, {report.cores} cores; "
        "install not included",
        "",
        "| corpus | backend | copied MB | index copy s | serve -> first 200 s | load s | first search s "
        "(warm / cold) | total s | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.rows:
        serve = f"{r.serve_s:.2f}" if r.serve_s is not None else "not served"
        load = f"{r.load_s:.2f}" if r.load_s is not None else ""
        first = (
            f"{r.first_search_warm_s:.3f} / {r.first_search_cold_s:.3f}"
            if r.first_search_warm_s is not None and r.first_search_cold_s is not None
            else ""
        )
        lines.append(
            f"| {r.corpus} | {r.backend} | {r.copy_mb:.1f} | {r.copy_s:.2f} | {serve} | {load} | {first} | "
            f"{r.total_s:.2f} | {r.note} |"
        )
    if report.build_s:
        built = ", ".join(f"{k} {v:.0f}s" if v else f"{k} reused" for k, v in report.build_s.items())
        lines += ["", f"One-time builds into the bucket: {built}"]
    if report.rates:
        lines += [
            "",
            "Rates: "
            + ", ".join(
                [
                    f"copy {report.rates['copy_mb_s']:.0f} MB/s (process start included)",
                    f"cold sequential read {report.rates['cold_read_mb_s']:.0f} MB/s",
                    f"Flat scan {report.rates['flat_scan_gb_s']:.1f} GB/s from page cache",
                ]
            ),
        ]
    return "\n".join(lines)


__all__ = ["StartReport", "StartRow", "format_report", "make_standin", "run_start_time"]
