"""`searchrl index scale` (searchrl/bench/scale.py): the widening map, the cost fit, the CLI's errors, a small run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from searchrl.bench.scale import (
    ScalePoint,
    fit_cost,
    parse_sizes,
    predict_ms,
    run_scale,
    synthetic,
    widen,
)
from searchrl.cli import main
from searchrl.errors import ConfigError
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS


def test_sizes_parse_with_suffixes_and_refuse_nonsense() -> None:
    assert parse_sizes("1M, 250k,2000000,250k") == (250_000, 1_000_000, 2_000_000)
    for bad in ("", "many", "500"):
        with pytest.raises(ConfigError, match="--sizes"):
            parse_sizes(bad)


def test_widening_keeps_inner_products_and_synthetic_vectors_stay_near_their_sources() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    wide = widen(x, 768)
    assert wide.shape == (50, 768)
    np.testing.assert_allclose(wide @ wide.T, x @ x.T, atol=1e-4)  # the geometry IVF sees is the real one
    with pytest.raises(ConfigError, match="--dim"):
        widen(x, 128)
    near = synthetic(wide, 2_000)
    np.testing.assert_allclose(np.linalg.norm(near, axis=1), 1.0, atol=1e-5)
    best = (near @ wide.T).max(axis=1)
    assert 0.7 < float(np.median(best)) < 0.9  # cosine ~0.8 to the source, as at 384 dims


def test_the_fit_recovers_a_known_cost_model_and_predicts_with_it() -> None:
    a, b, c = 0.05, 2e-7, 4e-9
    points = [
        ScalePoint(n, nlist, nprobe, 0.9, a + b * nprobe * n / nlist * 768 + c * nlist * 768 * 4,
                   nprobe * n / nlist * 768, nlist * 768 * 4.0)
        for n, nlist in ((250_000, 2048), (1_000_000, 4096), (2_000_000, 4096))
        for nprobe in (32, 64, 128)
    ]  # fmt: skip
    coef = fit_cost(points)
    np.testing.assert_allclose(coef, [a, b, c], rtol=1e-6, atol=1e-12)
    expected = a + b * 64 * 21_000_000 / 16_384 * 768 + c * 16_384 * 768 * 4
    assert predict_ms(coef, 21_000_000, 16_384, 64) == pytest.approx(expected)
    one_nlist = [p for p in points if p.nlist == 4096]  # c cannot be told apart from a: fitted as 0
    assert fit_cost(one_nlist)[2] == 0.0
    # timings on loaded cores that a plain least-squares fit explains with a negative intercept (here -5 ms): no
    # cost is negative, so neither is a prediction
    loaded = [ScalePoint(p.n, p.nlist, p.nprobe, p.recall, p.ms_per_query - 5.0, p.scanned_bytes, p.coarse_bytes)
              for p in points]  # fmt: skip
    coef = fit_cost(loaded)
    assert (coef >= 0).all() and coef[0] == 0.0
    assert 0 < predict_ms(coef, 21_000_000, 16_384, 32) < predict_ms(coef, 21_000_000, 16_384, 64)


@pytest.mark.slow
def test_a_small_scale_run_reports_builds_recall_timings_and_the_wiki18_prediction(tmp_path: Path) -> None:
    settings = RetrievalSettings(corpus=str(TINY_CORPUS), data_dir=str(tmp_path / "data"))
    report = run_scale(
        settings, sizes=(4_000, 8_000, 16_000), nprobes=(4, 16), n_queries=20, out_dir=tmp_path
    )
    assert [b["n"] for b in report["builds"]] == [4_000, 8_000, 16_000]
    assert all(b["index_bytes"] > b["n"] * 768 for b in report["builds"])  # SQ8: d bytes + id per vector
    assert len(report["points"]) == 6
    for p in report["points"]:
        assert 0.0 <= p["recall"] <= 1.0 and p["ms_per_query"] > 0
    by = {(p["n"], p["nprobe"]): p for p in report["points"]}
    assert all(by[(n, 16)]["recall"] >= by[(n, 4)]["recall"] - 0.05 for n in (4_000, 8_000, 16_000))
    assert [c["nprobe"] for c in report["holdout_check"]] == [4, 16]
    wiki = report["wiki18"]["search"]
    assert wiki[1]["ms_per_query"] > wiki[0]["ms_per_query"] > 0  # more lists probed cost more
    assert json.loads(Path(report["path"]).read_text())["cpu"] == report["cpu"]


def test_cli_refuses_bad_flags_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "scale", "--sizes", "lots"]) == 2
    assert "--sizes" in capsys.readouterr().err
    assert main(["index", "scale", "--nprobe", "x,y"]) == 2
    assert "--nprobe" in capsys.readouterr().err
