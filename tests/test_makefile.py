"""The Makefile's GPU targets fail in seconds on a machine without a GPU, before any download (issue 27 item 6)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _make(*args: str, tmp_path: Path, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            shutil.which("make") or "make",
            "--no-print-directory",
            *args,
            f"GPU_VENV={tmp_path}/gpu",
            f"TOOLS_VENV={tmp_path}/tools",
        ],
        cwd=REPO,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("target", ["train-smoke", "train-local"])
def test_gpu_targets_stop_at_the_gpu_check_without_nvidia_smi(tmp_path: Path, target: str) -> None:
    had_gpu_venv = (REPO / ".venv-gpu").exists()
    empty = tmp_path / "bin"  # a PATH with make's shell tools but no nvidia-smi and no uv
    empty.mkdir()
    for tool in ("sh", "grep", "cat"):
        (empty / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    t0 = time.monotonic()
    done = _make(target, tmp_path=tmp_path, path=str(empty))
    assert time.monotonic() - t0 < 10
    assert done.returncode != 0
    assert "error: no NVIDIA GPU here (nvidia-smi -L lists none)" in done.stderr
    assert not (tmp_path / "gpu").exists() and not (tmp_path / "tools").exists()
    assert (REPO / ".venv-gpu").exists() == had_gpu_venv


def test_gpu_venv_uses_the_pinned_uv_not_path(tmp_path: Path) -> None:
    plan = _make("-n", "train-smoke", "NVIDIA_SMI=true", tmp_path=tmp_path).stdout.splitlines()
    assert plan[0].startswith("true -L")  # the GPU check comes first
    uv_lines = [line for line in plan if " uv " in f" {line} " or "/uv " in line]
    assert uv_lines and all(
        line.startswith(f"{tmp_path}/tools/bin/uv ") for line in uv_lines if "venv" in line
    )
    assert f'{tmp_path}/tools/bin/pip install -q "uv>=0.13,<0.14"' in "\n".join(plan)
    assert not any(line.startswith("uv ") for line in plan)
