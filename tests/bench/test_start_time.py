"""`searchrl sky start-time`: the replica start measurement behind docs/deploy.md section 6, run small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.bench.start_time import format_report, run_start_time


@pytest.mark.live
def test_start_time_copies_serves_and_names_the_cpu(tmp_path: Path) -> None:
    """bundled bm25 through a real `searchrl index copy` and `searchrl serve` (probe 200), plus a 2,000-row stand-in."""
    report = run_start_time(tmp_path, backends=("bm25",), standin_passages=2_000)
    bm25, standin = report.rows
    assert (bm25.corpus, bm25.backend) == ("bundled", "bm25")
    assert bm25.copy_mb > 5 and 0 < bm25.copy_s < 120 and bm25.serve_s is not None and 0 < bm25.serve_s < 120
    assert (
        tmp_path / "replica-bm25" / "corpora" / "wiki-bundled-en.jsonl"
    ).is_file()  # copied, not converted
    assert report.build_s["bundled/bm25"] > 0  # first run builds into the bucket stand-in
    # the stand-in: 2,000 x 768 fp32 = 6.1 MB of index, loaded and searched in a fresh interpreter, never served
    assert standin.serve_s is None and "E5 model load not measured" in standin.note
    assert standin.load_s and standin.first_search_warm_s and standin.first_search_cold_s
    assert 6.1 < report.sizes_mb["wiki18-100k-standin/dense"] < 8
    assert set(report.rates) == {"copy_mb_s", "cold_read_mb_s", "flat_scan_gb_s"}
    text = format_report(report)
    assert report.cpu in text and f"{report.cores} cores" in text and "| bundled | bm25 |" in text
    assert json.loads((tmp_path / "start-time.json").read_text())["cpu"] == report.cpu
    again = run_start_time(
        tmp_path, backends=("bm25",), standin=False
    )  # the bucket is built once, then reused
    assert again.build_s["bundled/bm25"] == 0.0 and "bundled/bm25 reused" in format_report(again)


def test_start_time_cli_refuses_an_unknown_backend_in_one_line() -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "searchrl", "sky", "start-time", "--backends", "bm25,google"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --backends takes bm25 and/or dense, got 'bm25,google'"
