"""The `searchrl` entry point: help, usage errors, and the one-line error contract."""

from __future__ import annotations

import subprocess
import sys

import pytest

from searchrl import errors
from searchrl.cli import main


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
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SearchRLError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.QuotaExceededError, errors.BackendError)
