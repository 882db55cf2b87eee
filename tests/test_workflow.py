"""The GitHub Actions workflow a fork runs: it lints clean with actionlint and runs what README promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"


def _actionlint() -> str:
    found = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    if not Path(found).is_file():
        pytest.fail("actionlint is missing: it comes with the dev extra (pip install -e '.[dev]')")
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_actionlint(), "-no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_workflow_passes_actionlint() -> None:
    result = _lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """The lint above can fail: a misspelled key and an unknown expression context are both reported."""
    broken = WORKFLOW.read_text().replace("runs-on: ubuntu-24.04", "run-on: ubuntu-24.04", 1)
    broken = broken.replace("${{ github.ref }}", "${{ githubb.ref }}", 1)
    bad = tmp_path / ".github" / "workflows" / "ci.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(broken)
    result = _lint(bad)
    assert result.returncode != 0
    assert "run-on" in result.stdout and "githubb" in result.stdout


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_jobs_run_the_make_targets_users_run() -> None:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert _runs(jobs["test"]) == ["make test"]  # README's test command, as .ci/run
    assert "make test" in (REPO / "README.md").read_text()
    assert _runs(jobs["check"]) == ["make check"]
    assert _runs(jobs["gpu-lock"]) == ["make lock-check"]
    assert _runs(jobs["vllm-cpu"]) == ["make test-vllm"]  # opt-in outside make test (issue 46 item 6)
    (smoke,) = _runs(jobs["smoke-100k"])
    assert (
        smoke.startswith("make smoke ") and "--corpus wiki18-100k" in smoke and "--require-download" in smoke
    )
    for job in jobs.values():
        assert job.get("timeout-minutes"), "every job needs a timeout"
