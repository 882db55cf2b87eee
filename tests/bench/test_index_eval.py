"""`searchrl index eval` internals: placeholders, recall against Flat, sizes, on small clustered vectors."""

from __future__ import annotations

import numpy as np
import pytest

from searchrl.bench.index_eval import (
    auto_nlist,
    auto_pq_m,
    evaluate,
    fill_placeholders,
    recall_at,
    synthetic_vectors,
)
from searchrl.cli import main


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(32, dim)).astype(np.float32)
    x = centres[rng.integers(0, 32, size=n)] + 0.3 * rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_placeholders_follow_faiss_guidelines() -> None:
    assert auto_nlist(10_033) == 256  # 4*sqrt(N)=400 -> 512 would leave < 39 training points per list
    assert auto_nlist(21_015_324) == 16_384
    assert auto_nlist(10) == 1
    assert auto_pq_m(384) == 48 and auto_pq_m(768) == 96 and 100 % auto_pq_m(100) == 0
    assert fill_placeholders("IVF{nlist},PQ{pq_m}", 10_033, 384) == "IVF256,PQ48"


def test_recall_at_k() -> None:
    truth = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 2, 9], [4, 7, 8]])
    assert recall_at(found, truth, 1) == pytest.approx(0.5)
    assert recall_at(found, truth, 3) == pytest.approx(0.5)


def test_evaluate_compressed_types_against_flat() -> None:
    xb = clustered(4000, 64)
    xq = clustered(200, 64, seed=1)
    rows = evaluate(xb, xq, ["Flat", "IVF{nlist},SQ8", "HNSW16"], ks=(1, 3), nprobe=16, ef_search=64)
    by_type = {r.index_type: r for r in rows}
    flat, sq8, hnsw = by_type["Flat"], by_type["IVF64,SQ8"], by_type["HNSW16"]
    assert flat.recall == {"recall@1": 1.0, "recall@3": 1.0}
    # loaded as the dense backend loads them: Flat codes and IVF lists memory-mapped, not copied
    assert flat.loaded == "mmap" and sq8.loaded == "mmap-lists"
    assert flat.disk_bytes >= 4000 * 64 * 4
    # SQ8: one byte per dimension plus an 8-byte id per vector, vs four bytes per dimension
    assert sq8.disk_bytes < 0.40 * flat.disk_bytes
    assert sq8.recall["recall@3"] > 0.8
    assert sq8.nprobe == 16 and hnsw.ef_search == 64 and flat.nprobe is None
    assert hnsw.disk_bytes > flat.disk_bytes  # graph links on top of the full vectors


def test_synthetic_vectors_stay_near_their_sources() -> None:
    base = clustered(500, 384)
    syn = synthetic_vectors(base, 2000)
    assert syn.shape == (2000, 384) and syn.dtype == np.float32
    assert np.allclose(np.linalg.norm(syn, axis=1), 1.0, atol=1e-5)
    best = (syn @ base.T).max(axis=1)
    assert 0.7 < float(np.median(best)) < 0.9


def test_cli_rejects_bad_k(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["index", "eval", "--k", "three"])
    assert rc == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: --k: expected comma-separated integers such as 1,3,10, got 'three'"
    )
