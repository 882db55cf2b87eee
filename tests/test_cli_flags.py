"""searchrl/cli/flags.py: the flags several verbs share, and the one handler of the benchmark verbs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import build_parser, main
from searchrl.cli.flags import FLAGS


def _actions(*verb: str) -> dict[str, argparse.Action]:
    parser: Any = build_parser()
    for word in verb:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return {a.dest: a for a in parser._actions}


@pytest.mark.parametrize(
    "verb",
    [("serve",), ("bench",), ("reliability",), ("index", "build"), ("index", "eval"), ("index", "scale")],
)
def test_a_shared_flag_is_spelled_and_typed_alike_in_every_verb(verb: tuple[str, ...]) -> None:
    actions = _actions(*verb)
    for dest, (flag, kwargs) in FLAGS.items():
        if dest in actions:
            assert actions[dest].option_strings == [flag], (verb, dest)
            assert actions[dest].type == kwargs.get("type"), (verb, dest)
            assert actions[dest].default is argparse.SUPPRESS, (verb, dest)  # only typed flags reach settings


def test_a_verb_can_say_more_about_a_shared_flag() -> None:
    assert (
        _actions("index", "convert-bench")["data_dir"].help
        == "where the bundled corpus lives (default ./data)"
    )
    assert _actions("index", "scale")["data_dir"].help == FLAGS["data_dir"][1]["help"]
    assert _actions("index", "scale")["out_dir"].metavar == "OUT"  # `--out OUT` in --help, as before


def test_a_benchmark_verb_runs_with_the_settings_and_keywords_its_flags_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import searchrl.bench.scale as scale

    seen: dict[str, Any] = {}

    def run_scale(settings: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(settings=settings, kwargs=kwargs)
        return {"rows": 1}

    monkeypatch.setattr(scale, "run_scale", run_scale)
    monkeypatch.setattr(scale, "format_scale", lambda report: f"table of {report['rows']} row")
    argv = ["index", "scale", "--sizes", "2k", "--k", "5", "--out", str(tmp_path / "o")]
    assert main([*argv, "--data-dir", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out == "table of 1 row\n"
    assert seen["settings"].data_dir == tmp_path / "d"
    assert seen["kwargs"] == {
        "sizes": (2000,),
        "k": 5,
        "out_dir": tmp_path / "o",
    }  # flags not given: defaults


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["index", "scale", "--dim", "4"], "error: --dim: must be at least 8, got 4"),
        (["index", "convert-bench", "--chunk", "10"], "error: --chunk: must be at least 1000, got 10"),
        (["index", "eval", "--train-sample", "0"], "error: --train-sample: must be positive, got 0"),
        (["index", "eval", "--synthetic", "-1"], "error: --synthetic: must be positive, got -1"),
    ],
)
def test_a_number_below_its_bound_is_one_line_naming_the_flag(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == line
