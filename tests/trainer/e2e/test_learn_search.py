"""`make learn-search`, the whole run (opt-in: `pytest -m learn_search tests/trainer/e2e/test_learn_search.py`, ~30
minutes on 2 cores): SmolLM2-135M through verl's loop on verl's vLLM server, then `searchrl eval` and `compare`; it
ends in a verdict and a report. Its parts in seconds are tests/trainer/proofs/test_learn_search.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.trainer.proofs.record import read_record
from tests.conftest import REPO
from tests.trainer.proofs.test_learn_search import CORPUS


@pytest.mark.slow
@pytest.mark.learn_search  # ~30 minutes on 2 cores
def test_the_whole_run(tmp_path: Path):  # pragma: no cover
    from searchrl.trainer.proofs.learn_search import run_learn_search

    run = run_learn_search(tmp_path / "out", REPO / "data" / "models" / "smollm2-135m", corpus=CORPUS)
    assert run.verdict is not None
    record = read_record(tmp_path / "out")
    assert record["passed"] is run.verdict.learned and set(record["figures"]["held_out"]) == set(run.arms)
    assert (tmp_path / "out" / "report" / "report.html").is_file()
    assert (tmp_path / "out" / "reward_curve.png").is_file()
