"""`searchrl index build-bench` (searchrl/bench/build_precision.py) end to end on the tiny corpus: both builds on a
CPU with native BF16 (fp32 alone without), what bf16 changed, and what `precision=auto` picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.retrieval.encoders.precision import MIN_COSINE
from searchrl.retrieval.encoders.tuning import cpu_info, has_fast_bf16
from tests.conftest import TINY_CORPUS

pytest.importorskip("faiss")


def test_build_bench_builds_each_precision_and_says_what_bf16_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["index", "build-bench", "--corpus", str(TINY_CORPUS), "--data-dir", str(tmp_path / "data")]
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--queries", "20"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "precision=auto picks fp32: 20 passages are too few for measuring bf16 to pay off" in out
    report = json.loads((tmp_path / "out" / "build-precision.json").read_text())
    builds = {b["precision"]: b for b in report["builds"]}
    assert builds["fp32"]["build_s"] > 0 and 0 <= builds["fp32"]["recall@3"] <= 1
    if has_fast_bf16(cpu_info()["flags"]):
        diff = report["bf16_vs_fp32"]
        assert MIN_COSINE <= diff["cosine_min"] < 1 and diff["top3_overlap"] >= 0.9
        assert "bf16 vs fp32: " in out and set(builds) == {"fp32", "bf16"}
    else:
        assert "bf16 not built: this CPU has no native BF16" in out and set(builds) == {"fp32"}
