"""The Makefile's GPU targets fail in seconds on a machine without a GPU, before any download (issue 27 item 6);
`make check` type-checks every product module (issue 47 item 1); TRAINER_MODE is the one name of the trainer mode
(issue 47 item 4)."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import get_args

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
    # and a python3 (make asks trainer/node/flash_switch.py for FLASH_ATTN): the interpreter itself, not a shim
    (empty / "python3").symlink_to(os.path.realpath(sys.executable))
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


def test_check_reads_every_product_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree `make check` links under build/mypy/, read as mypy reads [tool.mypy] `files`, holds one module per
    .py file of searchrl/ (sub-packages included) and of each folder package-dir maps (retrieval/, trainer/,
    infer/): the count mypy prints."""
    from mypy.find_sources import create_source_list
    from mypy.options import Options

    plan = _make("-n", "check", tmp_path=tmp_path).stdout.splitlines()
    link = next(line for line in plan if line.startswith("rm -rf build/mypy "))
    subprocess.run(
        ["bash", "-c", link], cwd=tmp_path, check=True, timeout=60
    )  # relative build/mypy: in tmp_path
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    config = pyproject["tool"]["mypy"]
    options = Options()
    options.explicit_package_bases = config["explicit_package_bases"]
    options.mypy_path = [str(tmp_path / config["mypy_path"])]
    monkeypatch.chdir(tmp_path)
    files = [
        name for pattern in config["files"] for name in sorted(glob.glob(pattern))
    ]  # as mypy expands them
    read = [source.module for source in create_source_list(files, options)]
    folders = {
        "searchrl": "searchrl",
        **{f: p for p, f in pyproject["tool"]["setuptools"]["package-dir"].items()},
    }
    expected = set()
    for folder, package in folders.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            expected.add(".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)]))
    assert len(read) == len(set(read)) and set(read) == expected


def _cpu_run_argv(plan: str) -> list[str]:
    """The `searchrl train cpu ...` command of a `make -n` plan, as argv after `searchrl`."""
    (line,) = [ln for ln in plan.splitlines() if "/searchrl train cpu" in ln]
    return shlex.split(line)[1:]


@pytest.mark.parametrize("target", ["train-cpu", "learn-cpu"])
def test_cpu_runs_take_trainer_mode_and_async_is_its_alias_for_one_release(
    tmp_path: Path, target: str
) -> None:
    """TRAINER_MODE is the one name (make train, sky/train.yaml, train-cpu, learn-cpu) for verl's trainer mode; each
    of its values reaches `searchrl train cpu` as the CLI parses it. ASYNC=colocate|separate, the old name, means the
    same as TRAINER_MODE=<it>_async and says so in one line; a contradiction or another value is one line, exit 2."""
    from searchrl.cli import build_parser
    from searchrl.trainer.settings import TrainerMode

    parser = build_parser()
    plain = _make("-n", target, tmp_path=tmp_path)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    assert parser.parse_args(_cpu_run_argv(plain.stdout)).trainer_mode == "sync"  # the CLI's default
    for mode in get_args(TrainerMode):
        plan = _make("-n", target, f"TRAINER_MODE={mode}", tmp_path=tmp_path)
        assert plan.returncode == 0 and plan.stderr == "", plan.stderr
        assert parser.parse_args(_cpu_run_argv(plan.stdout)).trainer_mode == mode
        if mode == "sync":
            continue
        alias = mode.removesuffix("_async")
        for also in ([], [f"TRAINER_MODE={mode}"]):  # alone, or with the TRAINER_MODE it means
            aliased = _make("-n", target, f"ASYNC={alias}", *also, tmp_path=tmp_path)
            assert aliased.returncode == 0 and _cpu_run_argv(aliased.stdout) == _cpu_run_argv(plan.stdout)
            (said,) = aliased.stderr.splitlines()
            assert said.endswith(
                f": ASYNC={alias} is an alias of TRAINER_MODE={mode}, kept for one release: use TRAINER_MODE={mode}"
            )
    for bad, says in [
        (["ASYNC=colocate", "TRAINER_MODE=separate_async"], "disagrees with TRAINER_MODE=separate_async"),
        (["ASYNC=separate", "TRAINER_MODE=sync"], "disagrees with TRAINER_MODE=sync"),
        (["ASYNC=colocate_async"], "the alias takes colocate or separate"),
        (["ASYNC=yes"], "the alias takes colocate or separate"),
    ]:
        refused = _make("-n", target, *bad, tmp_path=tmp_path)
        assert refused.returncode == 2 and refused.stdout == "", (bad, refused.stdout)
        (line,) = refused.stderr.splitlines()
        assert says in line and line.endswith(".  Stop."), line


def test_each_opt_in_mark_is_registered_and_its_make_target_is_its_one_switch(tmp_path: Path) -> None:
    """The opt-in runs are marks (tests/conftest.py OPT_IN), `-m` the one switch: each mark is registered (strict
    markers), its make target passes `-m` naming it and no SEARCHRL_*_TESTS gate is left anywhere in tests/."""
    from tests.conftest import OPT_IN

    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    registered = {m.split(":")[0].split("(")[0] for m in markers}
    assert set(OPT_IN) <= registered
    for mark, where in OPT_IN.items():
        if where.startswith("make "):
            recipe = _make("-n", where.split()[1], tmp_path=tmp_path).stdout.splitlines()[-1]
            argv = shlex.split(recipe)
            m_arg = argv[len(argv) - 1 - argv[::-1].index("-m") + 1]  # pytest's -m, after python's
            assert mark in m_arg.split(), (where, recipe)
    gate = re.compile(r'environ\.get\(\s*"SEARCHRL_\w+_TESTS"')
    assert not [p for p in (REPO / "tests").rglob("*.py") if gate.search(p.read_text())]
