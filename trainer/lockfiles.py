"""The trainer's GPU environment as hash-pinned lock files, and the NVIDIA driver check that goes with them.

Run: `make lock` (= `searchrl train lock`) regenerates every lock from its inputs on any machine, no GPU needed:

    uv pip compile pyproject.toml requirements/gpu-<engine>.in --extra train --extra retrieval \
        [--override requirements/gpu-sglang-overrides.txt] --generate-hashes \
        --python-version 3.11 --python-platform x86_64-manylinux_2_34 -o requirements/gpu-<engine>-py311.txt

(engine vllm or sglang for the trainer; `infer` with the retrieval and infer extras for sky/infer.yaml.)

`x86_64-manylinux_2_34` because sglang ships only manylinux_2_34 wheels (../shared/DESIGN.md section 3), and a GPU
node's glibc is at least that new (Ubuntu 22.04 has 2.35). The project's own `train` and `retrieval` extras are
compiled in, so `uv pip sync <lock>` followed by `uv pip install --no-deps -e .` installs every package from the
lock and nothing else (sky/*.yaml `setup:`, `make train-local`). tests/trainer/test_lockfiles.py re-resolves the
inputs with uv and fails when the lock drifts from them or stops resolving.

The driver check lives in trainer/node/nvidia_driver.py (standard library only, so setup runs it before installing): a CUDA
build needs a driver at least as new as the one its toolkit shipped with (NVIDIA's
CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions",
https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/). The locked CUDA is read from the lock's
`nvidia-cuda-runtime` pin, so a new lock with another CUDA changes the requirement by itself.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from searchrl.errors import ConfigError
from searchrl.trainer.engines import GPU_ENGINES
from searchrl.trainer.node import nvidia_driver as driver
from searchrl.trainer.node.nvidia_driver import MIN_DRIVER

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = Path(
    "requirements"
)  # relative to the repo root, so lock headers and `# via` lines are portable
ENGINES = GPU_ENGINES  # the trainer's rollout engines (ROLLOUT), from trainer/engines.py
STACKS = (*ENGINES, "infer")  # every lock: the two trainer stacks and sky/infer.yaml's sglang server
PYTHONS = ("3.11", "3.12")
PLATFORM = "x86_64-manylinux_2_34"
# The project's extras compiled into each lock (the single-node trainer YAML serves retrieval next to verl).
EXTRAS = {"vllm": ("train", "retrieval"), "sglang": ("train", "retrieval"), "infer": ("retrieval", "infer")}
OVERRIDES = {"sglang": REQUIREMENTS / "gpu-sglang-overrides.txt"}
COMPILE_COMMAND = "make lock"  # written into each lock's header instead of the temp paths of the real call


@dataclass(frozen=True)
class LockSpec:
    engine: str  # vllm | sglang | infer
    python: str  # 3.11 | 3.12

    @property
    def extras(self) -> tuple[str, ...]:
        return EXTRAS[self.engine]

    @property
    def source(self) -> Path:
        return REQUIREMENTS / f"gpu-{self.engine}.in"

    @property
    def output(self) -> Path:
        return lock_path(self.engine, self.python)

    @property
    def override(self) -> Path | None:
        return OVERRIDES.get(self.engine)


def lock_path(engine: str, python: str) -> Path:
    """requirements/gpu-<engine>-py<NN>.txt, relative to the repo root."""
    return REQUIREMENTS / f"gpu-{engine}-py{python.replace('.', '')}.txt"


def all_locks() -> list[LockSpec]:
    return [LockSpec(e, p) for e in STACKS for p in PYTHONS]


def uv_binary() -> str:
    """uv next to this interpreter (the dev extra installs it), else on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if not found:
        raise ConfigError(
            "uv is not installed: pip install uv (it is in the dev extra: pip install -e '.[dev]')"
        )
    return found


def uv_compile(
    uv: str,
    sources: Sequence[str | Path],
    output: Path,
    *,
    extras: Sequence[str],
    python: str,
    platform: str,
    header: str,
    options: Sequence[str] = (),
) -> list[str]:
    """`uv pip compile` with hashes for one interpreter and platform, the header naming `header` as the command
    that wrote it: the call every lock of this repo is made with (the GPU stacks' below, the CPU vLLM venv's in
    trainer/cpu/vllm_env.py). `options`: what a lock adds (an override file, a wheel folder)."""
    cmd = [uv, "pip", "compile", *map(str, sources)]
    for extra in extras:
        cmd += ["--extra", extra]
    cmd += [
        *options,
        "--generate-hashes",
        "--python-version", python,
        "--python-platform", platform,
        "--custom-compile-command", header,
        "--quiet",
        "-o", str(output),
    ]  # fmt: skip
    return cmd


def compile_command(spec: LockSpec, output: Path, *, source: Path | None = None, uv: str = "uv") -> list[str]:
    """The exact `uv pip compile` call for one lock (run it from the repo root)."""
    return uv_compile(
        uv,
        ["pyproject.toml", source or spec.source],
        output,
        extras=spec.extras,
        python=spec.python,
        platform=PLATFORM,
        header=COMPILE_COMMAND,
        options=["--override", str(spec.override)] if spec.override is not None else [],
    )


def compile_lock(
    spec: LockSpec, output: Path | None = None, *, source: Path | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run uv for one lock. An existing `output` is uv's preference, so unchanged inputs keep their pins."""
    cmd = compile_command(spec, output or spec.output, source=source, uv=uv_binary())
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def write_locks(specs: Sequence[LockSpec] | None = None, *, cwd: Path = REPO) -> list[Path]:
    """`make lock`: (re)compile every lock; raise ConfigError with uv's own explanation when one has no solution."""
    written = []
    for spec in specs or all_locks():
        proc = compile_lock(spec, cwd=cwd)
        if proc.returncode != 0:
            reason = " ".join(proc.stderr.split())[:600]
            raise ConfigError(f"{spec.output} does not resolve: {reason}")
        written.append(cwd / spec.output)
    return written


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _config_error(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """trainer/node/nvidia_driver.py's functions, raising our ConfigError (one line) instead of its stdlib-only DriverError."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except driver.DriverError as exc:
            raise ConfigError(str(exc)) from None

    return wrapper


pins = driver.pins
installed_cuda = driver.installed_cuda
locked_cuda = _config_error(driver.locked_cuda)
min_driver_for = _config_error(driver.min_driver_for)
driver_version = _config_error(driver.driver_version)
check_driver_for = _config_error(driver.check_driver_for)


def check_driver(lock_file: Path, *, nvidia_smi: str = "nvidia-smi") -> str:
    """Raise ConfigError (one line) unless the node's driver is new enough for the lock's CUDA; return it."""
    return check_driver_for(locked_cuda(lock_file), f"in {lock_file.name}", nvidia_smi=nvidia_smi)


def current_lock(engine: str) -> Path:
    """The lock this interpreter was installed from (by engine and Python version)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python not in PYTHONS:
        raise ConfigError(f"no GPU lock for Python {python}: use Python {' or '.join(PYTHONS)}")
    return REPO / lock_path(engine, python)


__all__ = [
    "ENGINES",
    "MIN_DRIVER",
    "PLATFORM",
    "PYTHONS",
    "STACKS",
    "LockSpec",
    "all_locks",
    "check_driver",
    "check_driver_for",
    "compile_command",
    "compile_lock",
    "uv_compile",
    "current_lock",
    "driver_version",
    "installed_cuda",
    "lock_path",
    "locked_cuda",
    "min_driver_for",
    "pins",
    "write_locks",
]
