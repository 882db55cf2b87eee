"""`make learn-cpu`: verl's GRPO loop on CPU learns, and each of three deliberate bugs makes it fail (issue 31).

The learning run is in `make test` (minutes on 2 cores): as a user runs it, the CLI, its exit code, its last line
and its reward curve. The sabotage runs are `make test-sabotage` (three more learning runs): each switches on one
bug a peer shipped (trainer/sabotage.py) and must end in exit 2 with the one line that names the check it broke.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.trainer import sabotage
from searchrl.trainer.cpu_learn import MIN_RISE, STEPS

REPO = Path(__file__).resolve().parents[2]
LEARNED = re.compile(
    r"^learned: reward (\d\.\d+) -> (\d\.\d+) \(([+-]\d\.\d+)\); sync max prob diff (\S+); "
    r"observation tokens in loss (\d+); model-written searches (\d+)$"
)
SABOTAGE_TESTS = os.environ.get("SEARCHRL_SABOTAGE_TESTS") == "1"  # make test-sabotage


def _learn(out: Path, sabotaged: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sabotage.ENV}
    if sabotaged:
        env[sabotage.ENV] = sabotaged
    return subprocess.run(
        [sys.executable, "-m", "searchrl", "train", "cpu", "--learn", "--out", str(out), "--seeds", "0"],
        capture_output=True,
        text=True,
        timeout=2400,
        cwd=REPO,
        env=env,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(2400)  # ~5 min on a quiet 2-core machine, ~14 with other work on the same cores
def test_make_learn_cpu_learns_with_the_sync_and_masks_checked_on_every_step(tmp_path):
    proc = _learn(tmp_path / "learn")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = LEARNED.match(last)
    assert match, last
    first, final, delta = (float(g) for g in match.groups()[:3])
    assert final - first >= MIN_RISE and float(match.group(4)) < 1e-4 and match.group(5) == "0"
    rows = [line for line in proc.stdout.splitlines() if re.match(r"^\| \d+ \| (1|2 \(resumed\)) \| ", line)]
    assert len(rows) == STEPS
    assert (tmp_path / "learn" / "reward_curve.png").stat().st_size > 10_000
    assert "| seed | reward first 5 |" in proc.stdout


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(2400)
@pytest.mark.skipif(not SABOTAGE_TESTS, reason="three more learning runs: make test-sabotage")
@pytest.mark.parametrize(
    ("sabotaged", "named"),
    [
        (
            sabotage.STALE_SYNC,
            r"weight sync check failed at step 2 \(the update after step 1\): rollout holds",
        ),
        (sabotage.FLIP_ADVANTAGE, r"reward did not rise"),
        (sabotage.OBSERVATIONS_IN_LOSS, r"observation tokens in loss [1-9]\d*"),
    ],
)
def test_each_sabotage_fails_the_learning_run_with_one_line(tmp_path, sabotaged, named):
    proc = _learn(tmp_path / sabotaged, sabotaged)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    print(f"{sabotaged}: exit {proc.returncode}; {errors}; {proc.stdout.strip().splitlines()[-1:]}")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-4000:]
    assert len(errors) == 1 and re.search(named, errors[0]), errors
