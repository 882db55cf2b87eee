"""`searchrl index convert-bench` (searchrl/bench/convert.py): its Flat file and its fit, without the 2M run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from searchrl.bench.convert import fit_and_estimate, write_flat
from searchrl.bench.scale import WIKI18_N, WIKI18_NLIST
from searchrl.retrieval.index.convert_plan import FlatFile

faiss = pytest.importorskip("faiss")


def test_the_synthetic_flat_file_is_one_faiss_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(10, 48)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    path = tmp_path / "flat.index"
    write_flat(path, base, 1_000, block=300)  # blocks that do not divide n
    index = faiss.read_index(str(path))
    assert (index.ntotal, index.d, index.metric_type) == (1_000, 48, faiss.METRIC_INNER_PRODUCT)
    flat = FlatFile.open(path)
    rows = flat.read(0, 1_000)
    assert np.array_equal(rows, index.reconstruct_n(0, 1_000))
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    # each vector stays near one of the 10 bases: the cluster structure IVF is measured on
    assert float(np.min(np.max(rows @ base.T, axis=1))) > 0.5


def _report(a: float, b: float, t0: float, c: float) -> tuple[dict, list, list]:  # type: ignore[type-arg]
    d = 768
    chunks, train = [], []
    variants = []
    for nlist, sample in ((0, 65_536), (1024, 65_536), (4096, 262_144)):
        for rows in (262_144, 262_144, 163_840):
            chunks.append({"rows": rows, "nlist": nlist, "cpu_s": a * rows * d + b * rows * nlist * d})
        train.append(
            {"sample": sample, "nlist": nlist, "cpu_s": t0 + c * sample * nlist * d if nlist else 1.0}
        )
        merged = [(k * 250_000, int(0.7e9 + 800 * k * 250_000)) for k in range(1, 9)]
        variants.append(
            {
                "nlist": nlist,
                "threads": 2,
                "train_sample": sample,
                "merge_rss": merged,
                "cpu_seconds": {"merge": 4.0},
                "peak_rss": {"questions": int(0.7e9), "train": int(0.7e9 + 2.2 * sample * d * 4)},
            }
        )
    return {"dim": d, "n": 2_000_000, "variants": variants}, chunks, train


def test_the_fit_recovers_known_rates_and_the_estimate_adds_them_up() -> None:
    a, b, t0, c = 2e-8, 1.5e-11, 3.0, 4e-12
    report, chunks, train = _report(a, b, t0, c)
    fit = fit_and_estimate(report, chunks, train)
    assert fit["add"]["a_s_per_row_dim"] == pytest.approx(a, rel=1e-6)
    assert fit["add"]["b_s_per_row_nlist_dim"] == pytest.approx(b, rel=1e-6)
    assert fit["train"]["c_s_per_sample_nlist_dim"] == pytest.approx(c, rel=1e-6)
    assert fit["merge_rss"]["m1_bytes_per_vector"] == pytest.approx(800, rel=1e-6)
    e = fit["estimate_wiki18_16_cores"]
    assert e["label"].startswith("ESTIMATE")
    d, n = 768, WIKI18_N
    assert e["add_compute_s"] == pytest.approx((a * n * d + b * n * WIKI18_NLIST * d) / 16, rel=1e-6)
    assert e["train_s"] == pytest.approx((t0 + c * 64 * WIKI18_NLIST * WIKI18_NLIST * d) / 16, rel=1e-6)
    assert e["read_flat_s"] == pytest.approx(n * d * 4 / 125e6)  # 64.6 GB at 125 MB/s: 516 s
    assert e["total_s"] == pytest.approx(sum(v for k, v in e.items() if k.endswith("_s") and k != "total_s"))
    # memory: the merge line at 21M plus the 16384 - 4096 extra centroids, or training 4x the sample: the larger
    merge = 0.7e9 + 800 * n + (WIKI18_NLIST - 4096) * d * 4
    assert e["merge_peak_bytes"] == pytest.approx(merge, rel=1e-6)
    assert e["train_peak_bytes"] == pytest.approx(0.7e9 + 2.2 * 64 * WIKI18_NLIST * d * 4, rel=1e-6)
    assert e["peak_rss_bytes"] == max(e["merge_peak_bytes"], e["train_peak_bytes"])
