"""Import names that cannot collide, and one direction through the tree.

The folders users see stay at the top (`retrieval/`, `trainer/`, `infer/`) but import as `searchrl.retrieval`,
`searchrl.trainer`, `searchrl.infer` (pyproject's package-dir): a PyPI distribution named `trainer` (TTS stacks
pull one in) must not shadow the tool and reward verl loads by name on every Ray node.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import httpx
import pytest

from searchrl.retrieval.process import free_port, start_ready
from tests.conftest import REPO, run_outside

PACKAGE_DIRS = {
    "searchrl.retrieval": "retrieval",
    "searchrl.trainer": "trainer",
    "searchrl.infer": "infer",
}
# The layers, bottom up. The bottom layer is searchrl/*.py: glue all three rooms share; it imports nothing of ours
# but itself. The libraries (the rooms retrieval/, trainer/, infer/, and the bottom layer) never import the control
# layer (searchrl/deploy/), the CLI (searchrl/cli/, `python -m searchrl`) or the benchmarks (searchrl/bench/),
# which sit on top of them.
ROOMS = tuple(PACKAGE_DIRS)
TOP_PREFIXES = ("searchrl.deploy", "searchrl.cli", "searchrl.__main__", "searchrl.bench")


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _is_bottom(module: str) -> bool:
    return module.count(".") <= 1 and not _in(module, ROOMS + TOP_PREFIXES)


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    roots = {
        "searchrl": REPO / "searchrl",
        **{name: REPO / folder for name, folder in PACKAGE_DIRS.items()},
    }
    for name, root in roots.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([name, *parts])] = path
    return modules


def _our_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {m for m in found if m.split(".")[0] in {"searchrl", "retrieval", "trainer", "infer"}}


def test_no_code_imports_the_old_top_level_names() -> None:
    offenders = []
    for module, path in _module_files().items():
        offenders += [f"{module}: {m}" for m in _our_imports(path) if not m.startswith("searchrl")]
    for path in (REPO / "tests").rglob("*.py"):
        offenders += [f"{path}: {m}" for m in _our_imports(path) if not m.startswith("searchrl")]
    assert not offenders, offenders


def test_layers_point_one_way() -> None:
    """Every import counts, function-level ones included (ast.walk sees them): a lazy import is still a layer
    crossed."""
    wrong = []
    for module, path in _module_files().items():
        if _in(module, TOP_PREFIXES):
            continue
        imports = _our_imports(path)
        wrong += [f"{module} -> {m} (a library imports the top)" for m in imports if _in(m, TOP_PREFIXES)]
        if _is_bottom(module):
            wrong += [f"{module} -> {m} (the bottom layer imports a room)" for m in imports if _in(m, ROOMS)]
    assert not wrong, wrong


def test_the_layer_rule_sees_what_it_must() -> None:
    """The test above would pass vacuously if the modules were misfiled: pin a few."""
    modules = _module_files()
    assert _is_bottom("searchrl.errors") and _is_bottom("searchrl.devset") and _is_bottom("searchrl")
    assert not _is_bottom("searchrl.retrieval") and not _is_bottom("searchrl.deploy")
    assert not _is_bottom("searchrl.retrieval.serving.app") and not _is_bottom("searchrl.__main__")
    assert "searchrl.trainer.settings" in modules and "searchrl.deploy.smoke" in modules


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == PACKAGE_DIRS
    on_disk = {m for m, p in _module_files().items() if p.name == "__init__.py"}
    assert set(config["packages"]) == on_disk


@pytest.mark.slow
@pytest.mark.live
def test_wheel_beside_a_pypi_trainer_package(tmp_path: Path, searchrl_wheel: Path) -> None:
    """Build the wheel, install it into a fresh venv that already has a `trainer` package, import ours, run the
    CLI and serve a query. Third-party dependencies come from this interpreter's site-packages (a .pth line),
    so nothing but the wheel is installed and nothing of the repo is on the path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .decode()
        .strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (site / "trainer").mkdir()
    (site / "trainer" / "__init__.py").write_text("IS_DUMMY = True\n")
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--ignore-installed",
            "-q",
            str(searchrl_wheel),
        ],
        check=True,
        timeout=300,
    )

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        "import trainer, searchrl.trainer.toolconfig as t, searchrl.trainer.plugins.reward as r, searchrl.infer;"
        "assert trainer.IS_DUMMY;"
        "print(t.TOOL_CLASS, r.__file__)"
    )
    out = run_outside([python, "-c", probe], tmp_path)
    assert out.returncode == 0, out.stderr
    tool_class, reward_file = out.stdout.split()
    assert tool_class == "searchrl.trainer.plugins.tool.SearchTool"
    assert reward_file.startswith(str(site))

    searchrl = venv / "bin" / "searchrl"
    help_out = run_outside([searchrl, "--help"], tmp_path)
    assert help_out.returncode == 0 and "serve" in help_out.stdout

    port = free_port()
    body = {"queries": ["Who directed The Seventh Seal?"], "topk": 1, "return_scores": True}
    cmd = [str(searchrl), "serve", "--port", str(port), "--corpus", str(REPO / "tests/fixtures/tiny_corpus.jsonl"),
           "--data-dir", str(tmp_path / "data")]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    server = start_ready(
        cmd, url, tmp_path / "serve.log", env=env, cwd=tmp_path, path="/retrieve", json=body, timeout_s=120
    )
    try:
        reply = httpx.post(url + "/retrieve", json=body, timeout=2)
        assert reply.status_code == 200
        assert "Seventh Seal" in reply.json()["result"][0][0]["document"]["contents"]
    finally:
        server.terminate()
        server.wait(timeout=30)
