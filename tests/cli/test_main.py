"""The `searchrl` entry point: help, usage errors, and the one-line error contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from searchrl import errors
from searchrl.cli import main
from tests.conftest import REPO, free_port


def test_help_lists_areas(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out


def test_no_command_is_usage_error() -> None:
    assert main([]) == 2


def test_unknown_command_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2


def test_help_is_fast_and_imports_nothing_heavy() -> None:
    code = (
        "import sys; from searchrl.cli import build_parser; build_parser(); "
        "heavy = [m for m in ('torch', 'faiss', 'verl', 'sky', 'transformers') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_error_tree() -> None:
    """Every class errors.py exports is ours, so `searchrl` catches it (tests/test_errors.py checks the tree)."""
    for name in errors.__all__:
        if name != "first_line":
            assert issubclass(getattr(errors, name), errors.SearchRLError), name
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.QuotaExceededError, errors.BackendError)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "serper"], "error: backend 'serper' needs SERPER_API_KEY in the environment"),
        (["--backend", "bm25", "--no-build"], "error: no bm25 index at "),
    ],
    ids=["missing-key", "missing-index"],
)
def test_serve_start_up_errors_are_one_line_exit_2(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that cannot be configured, or fails while loading inside uvicorn's lifespan: the CLI's one
    `error:` line and exit 2, not uvicorn's traceback and exit 3."""
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    argv = [
        sys.executable,
        "-m",
        "searchrl",
        "serve",
        "--port",
        str(free_port()),
        "--data-dir",
        str(tmp_path),
        *args,
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Application startup failed" not in proc.stderr
