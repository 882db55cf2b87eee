"""trainer/node/stack_check.py as setup runs it (a subprocess with the venv's python): verl's declared version ranges
against what is installed (GPU_STACK=image), and flash-attn 2 itself, on stand-in packages put first on the path."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.trainer.conftest import write_flash_attn, write_image_site


def _image(tmp_path: Path, transformers: str) -> Path:
    return write_image_site(tmp_path / f"site-{transformers}", transformers)


def _check(*args: str, path: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(env)
    if path is not None:
        environ["PYTHONPATH"] = str(
            path
        )  # ahead of site-packages: the stand-ins win, as an image's copies would
    return subprocess.run(
        [sys.executable, str(REPO / "trainer" / "node" / "stack_check.py"), *args],
        capture_output=True, text=True, timeout=120, env=environ, cwd=REPO, check=False,
    )  # fmt: skip


def test_verl_declares_the_transformers_range_the_check_enforces():
    declared = [r for r in importlib.metadata.requires("verl") or [] if r.startswith("transformers")]
    assert "transformers!=5.6.0,<5.11,>=5.5.3" in declared


def test_an_image_with_a_transformers_below_verls_range_is_refused_in_one_line(tmp_path):
    """verlai/verl:sgl0512.dev4 carries transformers 5.3.0; verl 0.9.1 needs >=5.5.3 (issue 38)."""
    refused = _check("--requires", "verl", path=_image(tmp_path, "5.3.0"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith(
        "error: verl 0.9.1 needs what this environment does not have: transformers 5.3.0"
    )
    assert "GPU_STACK=lock" in lines[0]
    # verl's excluded release is refused too; one inside the range passes (the lock's 5.9.0)
    assert _check("--requires", "verl", path=_image(tmp_path, "5.6.0")).returncode == 2
    ok = _check("--requires", "verl", path=_image(tmp_path, "5.9.0"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "verl 0.9.1: its version ranges are met"


def test_no_verl_is_one_line_too(tmp_path):
    missing = _check("--requires", "no-such-package-xyz")
    assert missing.returncode == 2 and "no-such-package-xyz is not installed" in missing.stderr


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ({"fa4_only": True}, "has no flash-attn 2 CUDA extension"),
        ({"varlen": False}, "no flash_attn_varlen_func"),
    ],
    ids=["flash-attn-4-only", "no-varlen"],
)
def test_flash_attn_check_wants_fa2_and_names_flash_attn_0(tmp_path, layout, says):
    site = write_flash_attn(tmp_path / "site", **layout)
    refused = _check("--flash-attn", "1", path=site)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert says in refused.stderr and "FLASH_ATTN=0" in refused.stderr
    # the switch is an argument (setup passes trainer/node/flash_switch.py's answer): FLASH_ATTN is not read here
    assert _check("--flash-attn", "0", path=site, FLASH_ATTN="1").stdout.strip() == (
        "FLASH_ATTN=0: sdpa, flash-attn not needed"
    )
    assert _check("--flash-attn", "off").returncode == 2  # argparse: 1 or 0, never a word to parse again
    good = _check("--flash-attn", "1", path=write_flash_attn(tmp_path / "fa2"), FLASH_ATTN="0")
    assert good.returncode == 0, good.stderr
    assert "with its FA2 CUDA extension" in good.stdout
