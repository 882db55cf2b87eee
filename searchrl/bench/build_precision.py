"""`searchrl index build-bench` (make bench-build): one corpus's dense build in fp32 and in bf16, back to back.

For each precision (bf16 only on a CPU with native BF16, where `precision=auto` may pick it) it builds the corpus's
dense Flat index into its own directory and reports the build's seconds and passages/s, then what bf16 changed
against fp32: the cosine of every passage vector to its fp32 twin, the top 3 of held-out queries (the serving
gate's measure, retrieval/encoders/tuning.py) and recall@3 by supporting title on the dev QA set. It first prints
what `precision=auto` picks on this machine and why (retrieval/encoders/precision.py). The 1-minute load average
before each build is reported: on a shared machine compare the ratio, not the seconds.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.retrieval.settings import RetrievalSettings

K = 3


def run_build_bench(
    settings: RetrievalSettings,
    *,
    queries: int = 400,
    workdir: Path = Path("outputs/build-bench"),
    out_dir: Path = Path("outputs/bench"),
) -> dict[str, Any]:
    """Build, compare and score (module docstring); writes build-precision.json under out_dir and returns it."""
    import faiss

    from searchrl.retrieval.corpus import count_rows
    from searchrl.retrieval.encoders.encoder import Encoder
    from searchrl.retrieval.encoders.precision import bf16_twin, choose_build_encoder
    from searchrl.retrieval.encoders.tuning import cpu_info, has_fast_bf16
    from searchrl.retrieval.index.build import FAISS_FILE, build_dense_index, resolve_corpus
    from searchrl.retrieval.index.recall import load_qa, measure_recall
    from searchrl.retrieval.queries import DEV_QA, sample_queries

    fp32 = settings.with_changes(**{"device": "cpu", "precision": "fp32", "autotune": False})
    corpus_path = resolve_corpus(fp32)
    total = count_rows(corpus_path)
    encoder = Encoder.from_settings(fp32, batch_size=fp32.encode_batch_size)
    info = cpu_info()
    _, auto_choice = choose_build_encoder(encoder, corpus_path, total, batch_size=fp32.encode_batch_size)
    precisions = ["fp32", "bf16"] if has_fast_bf16(info["flags"]) else ["fp32"]
    held_out = sample_queries(corpus_path, limit=queries)
    xq = encoder.encode_queries(held_out)
    rows = load_qa(DEV_QA)
    builds: list[dict[str, Any]] = []
    vectors: dict[str, np.ndarray] = {}
    top: dict[str, np.ndarray] = {}
    for precision in precisions:
        index_dir = workdir / f"dense-{precision}"
        load = os.getloadavg()[0]
        manifest = build_dense_index(
            corpus_path,
            index_dir,
            encoder if precision == "fp32" else bf16_twin(encoder),
            batch_size=fp32.encode_batch_size,
            force=True,
        )
        index = faiss.read_index(str(index_dir / FAISS_FILE))
        vectors[precision] = index.reconstruct_n(0, index.ntotal)
        top[precision] = index.search(xq, K)[1]
        recall = measure_recall(fp32.with_changes(**{"backend": "dense", "index_dir": index_dir}), rows, K)
        builds.append(
            {
                "precision": precision,
                "build_s": manifest.build_seconds,
                "passages_per_s": round(total / manifest.build_seconds, 1),
                "load_avg_1m": round(load, 2),
                "recall@3": round(recall.recall, 4),
                "recall@3_all_titles": round(recall.all_recall, 4),
                "index_dir": str(index_dir),
            }
        )
    report: dict[str, Any] = {
        "corpus": f"{corpus_path.name} ({total} passages)",
        "encoder": encoder.spec.name,
        "cpu": info["model"],
        "cores": info["cores"],
        "auto_choice": auto_choice,
        "builds": builds,
        "queries": len(held_out),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if "bf16" in vectors:
        cosine = (vectors["fp32"] * vectors["bf16"]).sum(axis=1)
        overlap = [len(set(a) & set(b)) / K for a, b in zip(top["fp32"], top["bf16"], strict=True)]
        report["bf16_vs_fp32"] = {
            "speedup": round(builds[0]["build_s"] / builds[1]["build_s"], 2),
            "cosine_min": round(float(cosine.min()), 6),
            "cosine_mean": round(float(cosine.mean()), 6),
            "top3_overlap": round(float(np.mean(overlap)), 4),
            "top1_same": round(float(np.mean(top["fp32"][:, 0] == top["bf16"][:, 0])), 4),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "build-precision.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["path"] = str(path)
    return report


def format_build_bench(report: dict[str, Any]) -> str:
    lines = [
        f"{report['corpus']}, {report['encoder']}, {report['cpu']} ({report['cores']} cores)",
        f"precision=auto picks {report['auto_choice']}",
        f"{'precision':10} {'build s':>8} {'passages/s':>11} {'load 1m':>8} {'recall@3':>9} {'all titles':>11}",
    ]
    for b in report["builds"]:
        lines.append(
            f"{b['precision']:10} {b['build_s']:8.1f} {b['passages_per_s']:11.1f} {b['load_avg_1m']:8.2f} "
            f"{b['recall@3']:9.3f} {b['recall@3_all_titles']:11.3f}"
        )
    diff = report.get("bf16_vs_fp32")
    if diff:
        lines.append(
            f"bf16 vs fp32: {diff['speedup']:.2f}x faster; cosine min {diff['cosine_min']:.6f}, mean "
            f"{diff['cosine_mean']:.6f}; top 3 of {report['queries']} held-out queries {100 * diff['top3_overlap']:.1f}% "
            f"the same, top 1 {100 * diff['top1_same']:.1f}%"
        )
    else:
        lines.append("bf16 not built: this CPU has no native BF16")
    lines.append(f"results: {report['path']}")
    return "\n".join(lines)


__all__ = ["format_build_bench", "run_build_bench"]
