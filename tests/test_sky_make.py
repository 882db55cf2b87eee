"""`make train` / `make serve-retrieval-sky` and `searchrl sky train --dry-run` (issue 21 items 1 and 11).

The make targets are read with `make -n` (printed, nothing run); the dry run is the real CLI in SkyPilot's venv
with no service anywhere: it must print the task at once instead of waiting for one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
import yaml

from searchrl.deploy import skypilot
from tests.conftest import REPO

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make_n(*args: str) -> list[str]:
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", *args, "SKY_VENV=.venv-sky"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stdout.splitlines() if "searchrl sky" in ln or ln.startswith('echo "dry run')]


@needs_make
def test_make_train_runs_in_the_sky_venv_alone_with_the_network_tier() -> None:
    (line,) = make_n("train", "DRY_RUN=1", "NODES=2", "ENV=CHECKPOINT_BUCKET=b")
    assert line.startswith(".venv-sky/bin/python -m searchrl sky train ")  # no .venv/bin: no torch, no verl
    assert "--network-tier standard" in line and "--dry-run" in line
    (best,) = make_n("train", "NETWORK_TIER=best", "INFRA=aws/us-east-1")
    assert "--network-tier best" in best and "--infra aws/us-east-1" in best
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "train", "SKY_VENV=.venv-sky"], cwd=REPO, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "$(VENV)" not in proc.stdout and not any(
        ln.startswith(".venv/") for ln in proc.stdout.splitlines()
    )


@needs_make
def test_make_serve_retrieval_sky_passes_the_replica_size_and_dry_run_waits_for_nothing() -> None:
    serve, endpoint = make_n("serve-retrieval-sky", "CPUS=16+", "MEMORY=96+", "DISK_SIZE=256")
    assert "--cpus 16+ --memory 96+ --disk-size 256" in serve
    assert endpoint == ".venv-sky/bin/python -m searchrl sky endpoint searchrl-retrieval"
    serve, note = make_n("serve-retrieval-sky", "DRY_RUN=1")
    assert "--dry-run" in serve and note.startswith("echo") and "sky endpoint" not in note


def test_train_dry_run_without_a_service_prints_the_task_at_once() -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [skypilot.sky_python(), "-m", "searchrl", "sky", "train", "--dry-run", "--env", "CHECKPOINT_BUCKET=b",
         "--infra", "aws/us-east-1", "--network-tier", "best"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RETRIEVAL_API_KEY": "dry-run-token-1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60  # parsing only: no endpoint wait (2600 s by default), no health check
    task = yaml.safe_load(proc.stdout)
    assert task["envs"]["RETRIEVAL_SERVICE_URL"] == "http://unresolved-at-dry-run.invalid"
    assert "RETRIEVAL_SERVICE_URL above is a placeholder" in proc.stderr
    assert task["resources"]["infra"] == "aws/us-east-1" and task["resources"]["network_tier"] == "best"
    assert task["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert "dry-run-token-1" not in proc.stdout + proc.stderr
