"""searchrl/cli/flags.py: the flags several verbs share, and the one handler of the benchmark verbs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import build_parser, main
from searchrl.cli.flags import FLAGS, verb


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
        (["index", "build-bench", "--queries", "0"], "error: --queries: must be at least 1, got 0"),
    ],
)
def test_a_number_below_its_bound_is_one_line_naming_the_flag(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == line


def _doc_handler(args: argparse.Namespace) -> int:
    """say hello to a name

    Print one greeting on stdout: the words of the verb's
    own --help, folded onto one line by argparse.
    """
    return 0


def _tiny(*args: Any, **kwargs: Any) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t")
    verb(parser.add_subparsers(dest="v"), *args, **kwargs)
    return parser


def test_a_verb_declared_by_its_handler_shows_the_docstring_as_its_help_and_description() -> None:
    parser = _tiny("hello", _doc_handler)
    assert "hello     say hello to a name" in parser.format_help()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert (
        "Print one greeting on stdout: the words of the verb's own --help, folded onto one line by argparse."
        in " ".join(sub.choices["hello"].format_help().split())
    )
    args = parser.parse_args(["hello"])
    assert args.handler is _doc_handler


def test_a_verb_given_help_keeps_it_and_ignores_the_docstring() -> None:
    from searchrl.cli.train import _run_dir

    assert _run_dir.__doc__  # a note for readers, not the verb's help
    parser: Any = build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    run_dir = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction)).choices["run-dir"]
    assert run_dir.description is None
    assert _tiny("hello", _doc_handler, help="hi").format_help().count("hello     hi") == 1


def test_a_verb_without_help_or_docstring_is_refused_when_declared() -> None:
    def quiet(args: argparse.Namespace) -> int:
        return 0

    with pytest.raises(TypeError, match="verb 'q': no help given and no docstring on quiet"):
        _tiny("q", quiet)


def test_a_verb_suppresses_flags_not_given_unless_told_otherwise() -> None:
    for suppress, seen in ((True, {"v", "handler"}), (False, {"v", "handler", "n"})):
        parser = argparse.ArgumentParser(prog="t")
        verb(parser.add_subparsers(dest="v"), "x", _doc_handler, suppress=suppress).add_argument("--n")
        assert set(vars(parser.parse_args(["x"]))) == seen


@pytest.mark.parametrize(("area", "stream"), [("sky", "err"), ("train", "err"), ("index", "out")])
def test_a_group_given_no_verb_prints_its_help_and_exits_2(
    area: str, stream: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([area]) == 2
    printed = capsys.readouterr()
    assert getattr(printed, stream).startswith(f"usage: searchrl {area} [-h]")
    assert getattr(printed, "out" if stream == "err" else "err") == ""
