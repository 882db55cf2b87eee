"""Where SkyPilot lives: this interpreter, $SEARCHRL_SKY_PYTHON or `.venv-sky`; `sky` is imported only here, lazily.

SkyPilot 0.14.1 pins click 8.1.8, which conflicts with huggingface_hub and wandb in the main `.venv`, so it has
its own venv, and a `searchrl sky ...` run from an interpreter without it re-runs itself there
(`run_in_sky_venv`). Secret values travel only through the environment, never argv.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.errors import DeployError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SKY_DIR = REPO / "sky"
TASK_FILES = (
    "retrieval.yaml",
    "index-build.yaml",
    "index-convert.yaml",
    "train.yaml",
    "train-single.yaml",
    "merge.yaml",
    "infer.yaml",
)
SKY_VENV_PYTHON = REPO / ".venv-sky" / "bin" / "python"
SKY_INSTALL_HINT = (
    "SkyPilot is not installed: run `make sky-venv` (python3 -m venv .venv-sky && "
    ".venv-sky/bin/pip install 'skypilot==0.14.1' -e .), or set SEARCHRL_SKY_PYTHON to a python that has it"
)


def sky_importable() -> bool:
    """True if this interpreter can `import sky` (the real package, not the YAML folder `sky/` on sys.path)."""
    spec = importlib.util.find_spec("sky")
    return spec is not None and bool(spec.origin) and str(spec.origin).endswith("__init__.py")


def sky_python() -> str:
    """A python that can import SkyPilot: this one, $SEARCHRL_SKY_PYTHON, or .venv-sky/bin/python."""
    if sky_importable():
        return sys.executable
    explicit = os.environ.get("SEARCHRL_SKY_PYTHON")
    if explicit:
        return explicit
    if SKY_VENV_PYTHON.is_file():
        return str(SKY_VENV_PYTHON)
    raise DeployError(SKY_INSTALL_HINT)


def run_in_sky_venv(argv: Sequence[str]) -> int:
    """Re-run `searchrl <argv>` with the SkyPilot interpreter; secrets stay in the (inherited) environment."""
    python = sky_python()
    log.debug("re-running searchrl %s with %s", argv[:2], python)
    return subprocess.call([python, "-m", "searchrl", *argv], cwd=os.getcwd())


def _sky() -> Any:
    try:
        import sky
    except ImportError as exc:
        raise DeployError(SKY_INSTALL_HINT) from exc
    return sky
