"""Pick the query encoder's backend, precision, workers, threads and forward batch by measuring, at start-up.

Why: the right choice depends on the CPU, not on its name (issue 14): bf16 is ~2x fp32 on a CPU with AVX-512
BF16 and ~10x slower on an AVX2-only one; ONNX Runtime int8 wins where VNNI exists; how many workers pay off
depends on the core count. So the service measures on the machine it starts on:

1. Candidates: torch-fp32 (the reference), torch-bf16 (only when the CPU has fast bf16: avx512_bf16/amx_bf16
   on x86, bf16 on Arm), onnx-fp32 and onnx-int8 (exported and cached by retrieval/encoders/export.py).
   `encoder_backend` / `precision` narrow the list.
2. Quality gate: each candidate's top-3 on `gate_queries` queries (dev QA + corpus-derived, the benchmark's
   kind) against the fp32 torch encoder's top-3 on the same FAISS index; below `gate_min_recall` (0.99) it is
   refused with a one-line reason in the log and `GET /`. The result is also stored in the exported model's
   .json, keyed by index fingerprint.
3. Speed: each passing candidate encodes + searches batches of `batch_size` queries for `autotune_seconds`
   in each worker x thread layout of the cores; the fastest pair then tries forward batches of 16/32/64.
   The best measured configuration is served.

The choice is cached in `<index_dir>/encoders/<weights fingerprint>/tuning-<machine key>.json`, the key
hashing the CPU model, its flags, the usable cores and library versions, so a restart on the same kind of
machine skips the measurement and a different machine measures again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from searchrl.errors import ConfigError
from searchrl.retrieval.encoders.encoder import Encoder
from searchrl.retrieval.encoders.pool import EncoderPool, available_cores, own_tokenizer

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

GATE_K = 3
REFERENCE = "torch-fp32"
FORWARD_SIZES = (16, 32, 64)


@dataclass(frozen=True)
class Choice:
    """One runnable configuration of the query encoder."""

    candidate: str  # torch-fp32 | torch-bf16 | onnx-fp32 | onnx-int8
    workers: int
    threads: int  # per worker
    forward_batch_size: int

    @property
    def backend(self) -> str:
        return self.candidate.split("-")[0]

    @property
    def precision(self) -> str:
        return self.candidate.split("-")[1]


@dataclass
class TuningReport:
    """What `GET /` shows under "encoder_tuning" and the log line summarises."""

    choice: dict[str, Any]
    qps: float  # measured in-process, encode + FAISS search, for the choice
    reference_qps: float | None  # torch-fp32 with all cores at the configured forward batch
    candidates: list[dict[str, Any]] = field(default_factory=list)  # name, recall@3, qps, status
    layouts: list[dict[str, Any]] = field(default_factory=list)  # workers, threads, forward, qps
    machine: dict[str, Any] = field(default_factory=dict)
    gate_queries: int = 0
    cached: bool = False
    seconds: float = 0.0
    cache_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the machine --------------------------------------------------------------------------------------------
def cpu_info() -> dict[str, Any]:
    """CPU model and flags from /proc/cpuinfo (Linux), plus the cores this process may use."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return {"model": model, "flags": sorted(flags), "cores": len(available_cores())}


def has_fast_bf16(flags: set[str] | list[str]) -> bool:
    """Native bf16 dot products: AVX-512 BF16 or AMX on x86, the BF16 extension on Arm. Without them torch
    emulates bf16 and runs ~10x slower than fp32 (measured on an AVX2-only EPYC), so bf16 is never tried."""
    flags = set(flags)
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def machine_key(info: dict[str, Any]) -> str:
    versions = []
    for module in ("torch", "onnxruntime"):
        try:
            versions.append(f"{module}={__import__(module).__version__}")
        except ImportError:
            versions.append(f"{module}=none")
    raw = json.dumps([info["model"], info["flags"], info["cores"], versions])
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


# --- candidates -----------------------------------------------------------------------------------------------
def candidate_names(settings: RetrievalSettings, fast_bf16: bool, onnx_ok: bool) -> list[str]:
    """The configurations the settings allow on this machine, reference first."""
    backends = ["torch", "onnx"] if settings.encoder_backend == "auto" else [settings.encoder_backend]
    names: list[str] = []
    for backend in backends:
        precisions = {"torch": ["fp32", "bf16"], "onnx": ["fp32", "int8"]}[backend]
        if settings.precision != "auto":
            if settings.precision not in precisions:
                if settings.encoder_backend == "auto":
                    continue  # e.g. int8 exists only on onnx
                raise ConfigError(
                    f"precision {settings.precision} is not available on the {backend} encoder backend; "
                    f"use one of {', '.join(precisions)} (or encoder_backend=auto)"
                )
            precisions = [settings.precision]
        for precision in precisions:
            names.append(f"{backend}-{precision}")
    if not names:
        raise ConfigError(
            f"precision {settings.precision} is not served on CPU; use auto, fp32, bf16 or int8"
        )
    if "onnx" in backends and not onnx_ok:
        if settings.encoder_backend == "onnx":
            raise ConfigError(
                "encoder_backend=onnx needs onnxruntime and onnx: pip install -e '.[retrieval]'"
            )
        names = [n for n in names if not n.startswith("onnx")]
    if not fast_bf16 and "torch-bf16" in names:
        if settings.precision == "bf16":
            log.warning(
                "precision bf16 requested on a CPU without fast bf16 (avx512_bf16/amx_bf16); serving it"
            )
        else:
            names.remove("torch-bf16")
    return names


def _build(
    name: str, base: Encoder, index_dir: Path, fingerprint: str, threads: int, forward: int
) -> Encoder:
    """A fresh encoder for candidate `name` on the calling thread (own tokenizer; weights shared or exported)."""
    if name.startswith("onnx"):
        from searchrl.retrieval.encoders.export import OnnxEncoder, ensure_export

        path = ensure_export(base, index_dir, name, fingerprint)
        return OnnxEncoder.open(path, own_tokenizer(base), threads=threads, batch_size=forward)
    import torch

    torch.set_num_threads(threads)
    encoder = own_tokenizer(base)
    encoder.batch_size = forward
    if name == "torch-bf16":
        encoder.model = copy.deepcopy(base.model).to(torch.bfloat16)
        encoder.precision = "bf16"
    return encoder


def make_pool(
    choice: Choice,
    base: Encoder,
    index_dir: Path,
    fingerprint: str,
    *,
    name: str = "encoder",
    pin: bool = True,
) -> EncoderPool:
    """The workers for `choice`. Weights are loaded once and shared where that is safe: torch modules always
    (inference is thread-safe and torch's thread count is per process anyway), an ONNX Runtime session when
    each worker has one thread (`run` is thread-safe and a 1-thread session runs on the caller's, pinned,
    thread). Only ONNX workers with several threads each get their own session, for their own thread pool.
    So 16 one-thread workers hold one copy of E5-base, not 16."""
    shared: list[Encoder] = []

    def factory(_i: int) -> Encoder:
        if shared and (choice.backend == "torch" or choice.threads == 1):
            return own_tokenizer(shared[0])
        encoder = _build(
            choice.candidate, base, index_dir, fingerprint, choice.threads, choice.forward_batch_size
        )
        shared.append(encoder)
        return encoder

    return EncoderPool(factory, workers=choice.workers, threads=choice.threads, name=name, pin=pin)


# --- measuring ----------------------------------------------------------------------------------------------
def recall_at_k(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean |top-k ∩ reference top-k| / k over queries (row ids from FAISS; -1 pads never count)."""
    total = 0.0
    for ref, got in zip(reference.tolist(), candidate.tolist(), strict=True):
        want = {r for r in ref if r >= 0}
        total += len(want & set(got)) / max(1, len(want))
    return total / max(1, len(reference))


def measure_qps(encoder: Any, index: Any, queries: list[str], batch_size: int, seconds: float) -> float:
    """Queries/s of encode + FAISS search on batches of `batch_size` queries (cycled: no cache here)."""
    k = min(GATE_K, int(index.ntotal))
    warm = queries[:batch_size]
    index.search(encoder.encode_queries(warm), k)  # first call allocates / optimises the graph
    done, pos = 0, 0
    started = time.perf_counter()
    while True:
        batch = [queries[(pos + i) % len(queries)] for i in range(batch_size)]
        pos += batch_size
        index.search(encoder.encode_queries(batch), k)
        done += batch_size
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return done / elapsed


def layouts(cores: int) -> list[tuple[int, int]]:
    """(workers, threads per worker) that use every core once: 1 x N, ..., N x 1 (powers of two)."""
    out, workers = [], 1
    while workers <= cores:
        if cores % workers == 0:
            out.append((workers, cores // workers))
        workers *= 2
    if (cores, 1) not in out:
        out.append((cores, 1))
    return out


def _cache_path(index_dir: Path, fingerprint: str, key: str) -> Path:
    from searchrl.retrieval.encoders.export import export_dir

    return export_dir(index_dir, fingerprint) / f"tuning-{key}.json"


@dataclass(frozen=True)
class _Bench:
    """What every measurement of one tuning shares: the settings, the fp32 torch encoder the index was built with,
    the index, the gate and timing queries, and where exports are cached."""

    settings: RetrievalSettings
    base: Encoder
    index: Any
    index_dir: Path
    fingerprint: str  # of the encoder's weights: names the export and tuning cache folder
    index_fingerprint: str
    queries: list[str]

    @property
    def k(self) -> int:
        return min(GATE_K, int(self.index.ntotal))

    def pool(self, choice: Choice, name: str = "encoder") -> EncoderPool:
        return make_pool(
            choice, self.base, self.index_dir, self.fingerprint, name=name, pin=self.settings.encoder_pin
        )

    def qps(self, encoder: Any) -> float:
        s = self.settings
        return measure_qps(encoder, self.index, self.queries, s.batch_size, s.autotune_seconds)


def _wanted(settings: RetrievalSettings, names: list[str], index_fingerprint: str) -> dict[str, Any]:
    """What a cached choice must have been measured for: the same candidates, index and knobs."""
    return {
        "candidates": names,
        "index": index_fingerprint,
        "workers": settings.encoder_workers,
        "threads": settings.threads,
        "forward": settings.forward_batch_size,
        "batch_size": settings.batch_size,
        "pin": settings.encoder_pin,
        "gate_min_recall": settings.gate_min_recall,
        "gate_queries": settings.gate_queries,
    }


def _cached(
    bench: _Bench, cache: Path, wanted: dict[str, Any], started: float
) -> tuple[EncoderPool, TuningReport] | None:
    """The choice `cache` holds for exactly `wanted`, with its pool; None when it holds none (or is unreadable)."""
    if not cache.is_file():
        return None
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if saved.get("wanted") != wanted:
        return None
    report = TuningReport(**saved["report"])
    pool = bench.pool(Choice(**report.choice))
    report.cached, report.seconds, report.cache_path = True, time.perf_counter() - started, str(cache)
    _log_choice(report)
    return pool, report


def _gate_recall(bench: _Bench, encoder: Encoder, gate_set: list[str], reference_rows: np.ndarray) -> float:
    """recall@3 of `encoder` against the reference's top-3, recorded beside an exported model, keyed by index."""
    from searchrl.retrieval.encoders.export import read_sidecar, write_sidecar

    recall = recall_at_k(reference_rows, bench.index.search(encoder.encode_queries(gate_set), bench.k)[1])
    meta_path = getattr(encoder, "path", None)
    if meta_path is not None:
        meta = read_sidecar(meta_path) or {}
        meta.setdefault("gate", {})[bench.index_fingerprint] = {
            "recall@3": recall,
            "queries": len(gate_set),
            "min_recall": bench.settings.gate_min_recall,
        }
        try:
            write_sidecar(meta_path, meta)
        except OSError as exc:  # a read-only index directory: the gate still applies, unrecorded
            log.warning("cannot record the gate result beside %s (%s)", meta_path, exc)
    return recall


def _gate_one(
    bench: _Bench, name: str, gate_set: list[str], reference_rows: np.ndarray, threads: int
) -> dict[str, Any]:
    """Candidate `name`'s row: built with `threads`, its recall@3 against the fp32 torch encoder, and its queries/s
    when it passes the gate (`qps` stays None for a refused one, `status` says why)."""
    s = bench.settings
    row: dict[str, Any] = {"name": name, "recall@3": None, "qps": None, "status": "ok"}
    try:
        encoder = _build(name, bench.base, bench.index_dir, bench.fingerprint, threads, s.forward_batch_size)
    except Exception as exc:  # an export that fails must not stop a service that can run on torch
        if name == REFERENCE:
            raise
        row["status"] = f"refused: could not build ({type(exc).__name__}: {str(exc)[:120]})"
        log.warning("encoder %s refused: %s", name, row["status"])
        return row
    recall = 1.0 if name == REFERENCE else _gate_recall(bench, encoder, gate_set, reference_rows)
    row["recall@3"] = round(recall, 4)
    if recall < s.gate_min_recall:
        row["status"] = (
            f"refused: recall@3 {recall:.3f} vs fp32 torch < {s.gate_min_recall} on {len(gate_set)} queries"
        )
        log.warning("encoder %s %s", name, row["status"])
        return row
    row["qps"] = round(bench.qps(encoder), 1)
    return row


def _gate(bench: _Bench, names: list[str], cores: int) -> tuple[list[dict[str, Any]], int]:
    """Every candidate's row (name, recall@3, qps, status), each built with all threads; and the gate's size."""
    gate_set = bench.queries[: bench.settings.gate_queries]
    reference_rows = bench.index.search(bench.base.encode_queries(gate_set), bench.k)[1]
    threads = bench.settings.threads or cores
    return [_gate_one(bench, name, gate_set, reference_rows, threads) for name in names], len(gate_set)


def _layout_options(settings: RetrievalSettings, cores: int) -> list[tuple[int, int]]:
    """The (workers, threads per worker) to measure: the configured ones, or every layout of the cores."""
    if settings.encoder_workers:
        return [(settings.encoder_workers, max(1, (settings.threads or cores) // settings.encoder_workers))]
    if settings.threads:
        return [(1, settings.threads)]
    return layouts(cores)


def _measure_choice(
    bench: _Bench, choice: Choice, gated: dict[str, float], cores: int, layout_rows: list[dict[str, Any]]
) -> float:
    """Queries/s of `choice` (the gate's figure where the gate measured this very layout), logged in
    `layout_rows`."""
    s = bench.settings
    gate_layout = (1, s.threads or cores, s.forward_batch_size)  # one worker with every thread
    if (choice.workers, choice.threads, choice.forward_batch_size) == gate_layout:
        qps = gated[choice.candidate]  # measured by the gate
    else:
        pool = bench.pool(choice, name="tune")
        try:
            qps = bench.qps(pool)
        finally:
            pool.close()
    layout_rows.append(
        {
            "candidate": choice.candidate,
            "workers": choice.workers,
            "threads": choice.threads,
            "forward": choice.forward_batch_size,
            "qps": round(qps, 1),
        }
    )
    return qps


def _search_layouts(
    bench: _Bench, passing: list[tuple[str, float]], cores: int
) -> tuple[tuple[float, Choice], list[dict[str, Any]]]:
    """The fastest (queries/s, choice) and a row per measurement.

    Every passing candidate in every layout at the configured forward size (torch workers share the GIL for per-op
    dispatch, ONNX Runtime releases it for a whole forward pass, so which one wins can change with the layout), then
    forward sizes for the best pair only: seconds, not a full grid."""
    s = bench.settings
    forward, options = s.forward_batch_size, _layout_options(s, cores)
    gated = dict(passing)
    layout_rows: list[dict[str, Any]] = []
    best: tuple[float, Choice] | None = None
    for name, _ in passing:
        for workers, threads in options:
            choice = Choice(name, workers, threads, forward)
            qps = _measure_choice(bench, choice, gated, cores, layout_rows)
            if best is None or qps > best[0]:
                best = (qps, choice)
    assert best is not None
    if not s.encoder_workers and len(options) > 1:
        top = best[1]
        for fwd in FORWARD_SIZES:
            if fwd != forward:
                choice = Choice(top.candidate, top.workers, top.threads, fwd)
                qps = _measure_choice(bench, choice, gated, cores, layout_rows)
                if qps > best[0]:
                    best = (qps, choice)
    return best, layout_rows


def _save_cache(cache: Path, wanted: dict[str, Any], report: TuningReport) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(
            json.dumps({"wanted": wanted, "report": report.to_dict()}, indent=2), encoding="utf-8"
        )
    except OSError as exc:
        log.warning(
            "cannot cache the encoder tuning at %s (%s); it will be measured again next start", cache, exc
        )


def tune(
    settings: RetrievalSettings,
    base: Encoder,
    index: Any,
    index_dir: Path,
    index_fingerprint: str,
    queries: list[str],
) -> tuple[EncoderPool, TuningReport]:
    """Choose, measure (or read the cached choice), and return the encoder pool to serve with.

    `base` is the fp32 torch encoder the index was built with; `queries` the gate and timing queries.
    """
    from searchrl.retrieval.encoders.export import onnxruntime_available, weights_fingerprint

    started = time.perf_counter()
    info = cpu_info()
    fast_bf16 = has_fast_bf16(info["flags"])
    names = candidate_names(settings, fast_bf16, onnxruntime_available())
    bench = _Bench(settings, base, index, index_dir, weights_fingerprint(base), index_fingerprint, queries)
    wanted = _wanted(settings, names, index_fingerprint)
    cache = _cache_path(index_dir, bench.fingerprint, machine_key(info))
    cached = _cached(bench, cache, wanted, started)
    if cached is not None:
        return cached

    rows, gate_size = _gate(bench, names, info["cores"])
    passing = [(row["name"], row["qps"]) for row in rows if row["qps"] is not None]
    if not passing:
        reasons = "; ".join(f"{r['name']} {r['status']}" for r in rows)
        raise ConfigError(
            f"no query encoder passed the quality gate ({reasons}); use encoder_backend=auto or lower "
            "gate_min_recall"
        )
    best, layout_rows = _search_layouts(bench, passing, info["cores"])
    report = TuningReport(
        choice=asdict(best[1]),
        qps=round(best[0], 1),
        reference_qps=next((r["qps"] for r in rows if r["name"] == REFERENCE), None),
        candidates=rows,
        layouts=layout_rows,
        machine={"cpu": info["model"], "cores": info["cores"], "fast_bf16": fast_bf16},
        gate_queries=gate_size,
        seconds=round(time.perf_counter() - started, 2),
        cache_path=str(cache),
    )
    _save_cache(cache, wanted, report)
    pool = bench.pool(best[1])
    _log_choice(report)
    return pool, report


def _log_choice(report: TuningReport) -> None:
    c = report.choice
    others = ", ".join(
        f"{r['name']} {r['qps']:.0f} q/s" if r["qps"] else f"{r['name']} {r['status']}"
        for r in report.candidates
    )
    log.info(
        "encoder auto-tune%s: %s, %d workers x %d threads, forward %d: %.0f queries/s in-process (%s) in %.1fs",
        " (cached)" if report.cached else "",
        c["candidate"],
        c["workers"],
        c["threads"],
        c["forward_batch_size"],
        report.qps,
        others,
        report.seconds,
    )


def serving_encoder(
    settings: RetrievalSettings,
    base: Encoder,
    index: Any,
    index_dir: Path,
    index_fingerprint: str,
    corpus_path: Path,
) -> tuple[EncoderPool, dict[str, Any] | None]:
    """The encoder the dense backend serves with, and the tuning report for `GET /` (None on a GPU).

    On a GPU the loaded torch encoder is served as configured (fp16 by default). On CPU, `tune` measures;
    with `autotune=false` it serves exactly what the settings say (auto: torch fp32, one worker), still
    through the quality gate and with its measured queries/s.
    """
    if base.device.startswith("cuda"):
        return EncoderPool(lambda _i: base, workers=1, threads=1), None
    from searchrl.retrieval.queries import sample_queries

    if not settings.autotune:
        settings = settings.with_changes(
            **{
                "encoder_backend": "torch"
                if settings.encoder_backend == "auto"
                else settings.encoder_backend,
                "precision": "fp32" if settings.precision == "auto" else settings.precision,
                "encoder_workers": settings.encoder_workers or 1,
            }
        )
    queries = sample_queries(corpus_path, limit=max(settings.gate_queries, 2 * settings.batch_size))
    pool, report = tune(settings, base, index, index_dir, index_fingerprint, queries)
    return pool, report.to_dict()


__all__ = [
    "Choice",
    "TuningReport",
    "candidate_names",
    "cpu_info",
    "serving_encoder",
    "has_fast_bf16",
    "layouts",
    "make_pool",
    "recall_at_k",
    "tune",
]
