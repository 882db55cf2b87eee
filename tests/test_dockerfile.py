"""The optional CPU image of the retrieval service lints clean with hadolint and installs what serve needs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from searchrl.devset import dev_qa_path
from tests.conftest import REPO, TINY_CORPUS, run_outside

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


# The image's encoder quality gate, run from an unpacked wheel: `serving_encoder` with `tune` replaced by a
# recorder, so no encoder or index is loaded. Prints where searchrl came from and the gate's query list.
_GATE_PROBE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import searchrl.retrieval.encoders.tuning as tuning
from searchrl.retrieval.settings import RetrievalSettings
seen = []
def record(settings, base, index, index_dir, fingerprint, queries):
    seen.extend(queries)
    return None, SimpleNamespace(to_dict=dict)
tuning.tune = record
tuning.serving_encoder(RetrievalSettings(), SimpleNamespace(device="cpu"), None, Path("."), "", Path(sys.argv[2]))
print(json.dumps({"file": tuning.__file__, "queries": seen}))
"""


@pytest.mark.slow
def test_gate_queries_in_an_installed_wheel_start_with_the_dev_set(
    tmp_path: Path, searchrl_wheel: Path
) -> None:
    """Issue 33, bug 2: the image installs the wheel (`pip install ".[retrieval]"`, not editable) and copies no
    tests/, and its quality gate silently dropped the 30 dev questions, which it read through tests/fixtures.
    Here the wheel is unpacked where no tests/ sits beside it and imported from there alone."""
    site = tmp_path / "site"
    with zipfile.ZipFile(searchrl_wheel) as archive:
        archive.extractall(site)
    assert not (site / "tests").exists() and not (site / "searchrl" / "tests").exists()
    out = run_outside([sys.executable, "-c", _GATE_PROBE, site, TINY_CORPUS], tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["file"].startswith(str(site)), result["file"]  # the wheel, not the editable checkout
    dev = [json.loads(line)["question"] for line in dev_qa_path().read_text().splitlines() if line.strip()]
    assert len(dev) == 30
    assert result["queries"][:30] == dev
