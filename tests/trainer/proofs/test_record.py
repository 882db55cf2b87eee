"""A run's record, `<out>/run.json` (trainer/proofs/record.py): strict JSON, the verdict a failed run ended with, and
the checks line's figures as the line prints them."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from searchrl.trainer.proofs.record import PASSED, RECORD, read_record, record_text, write_record
from searchrl.trainer.step_checks import Checks


def test_a_passed_run_and_a_failed_one_are_recorded_as_strict_json(tmp_path):
    write_record(
        tmp_path, "learn-cpu", None, {"rise": 0.12, "probe": math.nan, "seeds": [{"wall_s": math.inf}]}
    )
    record = json.loads((tmp_path / RECORD).read_text())  # no NaN or Infinity tokens: any reader takes it
    assert record == {
        "run": "learn-cpu",
        "passed": True,
        "verdict": PASSED,
        "figures": {"rise": 0.12, "probe": None, "seeds": [{"wall_s": None}]},
    }
    write_record(tmp_path, "learn-cpu", "reward did not rise: +0.010", {"rise": 0.01})
    assert read_record(tmp_path)["verdict"] == "reward did not rise: +0.010"
    assert read_record(tmp_path)["passed"] is False
    # a run that names its own file writes the same text (make learn-cpu: trainer/proofs/learn.py LearnFiles)
    assert (tmp_path / RECORD).read_text() == record_text(
        "learn-cpu", "reward did not rise: +0.010", {"rise": 0.01}
    )
    with pytest.raises(FileNotFoundError):
        read_record(tmp_path / "none")


def test_the_checks_figures_are_the_line_s():
    checks = Checks(22, 7.2e-07, 20, 20, 0, 26912, 0, 0, 0)
    assert checks.line() == (
        "checks: 22 syncs fingerprinted, all matched; sync max prob diff 7.2e-07 over 20 steps; 0 observation tokens "
        "in the loss (26912 seen); 0 mask tokens outside the generated spans, 0 generated tokens unmasked, "
        "0 trajectories unrecorded"
    )
    assert asdict(checks)["observation_tokens_seen"] == 26912
    stale = Checks(30, 1e-9, 3, 30, 0, 10, 0, 0, 0, async_mode=True)
    assert "over 3 of 30 steps (staleness 0)" in stale.line()
