"""Every command the docs show exists as written (issue 27 item 3).

The fenced shell blocks of README.md, docs/*.md and sky/README.md are read line by line (backslash
continuations joined, comments dropped), and so are inline code spans that start with `searchrl `, `make ` or
`python `. Each `searchrl <sub> [<sub>]` must name subcommands of the real parser
(`searchrl.cli.build_parser()`, walked through its subparsers) and each `--flag` after it must be an option of
that subcommand; each `make <target>` must be a target of the Makefile. Commands on other programs are not
checked here, except that a bare `python -m <our module>`, `pytest` or `pip install` is refused: outside an
activated venv it is the system one.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from searchrl.cli import build_parser
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "sky" / "README.md"]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\s*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:[A-Z_]+=\S+ )*(?:searchrl|make|python3?|pip3?|pytest) [^`]+)`")
SEPARATORS = {"&&", "||", "|", ";", "&"}
# a bare python/pip/pytest is refused only where it runs this repo's code (verl or sglang run in their own envs)
OUR_MODULES = ("tests", "searchrl", "pytest", "retrieval", "trainer", "infer")


def _commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv) of every simple command in the file's shell blocks."""
    text = path.read_text(encoding="utf-8")
    out: list[tuple[int, list[str]]] = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        joined, start = "", first
        for offset, line in enumerate(block.group(1).splitlines()):
            if not joined:
                start = first + offset
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            joined += line
            lexer = shlex.shlex(joined, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                tokens = list(lexer)
            except ValueError:  # an unbalanced quote in prose-like output: not a command
                tokens = []
            joined = ""
            argv: list[str] = []
            for tok in [*tokens, ";"]:
                if tok in SEPARATORS or set(tok) <= set(";&|"):
                    if argv:
                        out.append((start, argv))
                    argv = []
                else:
                    argv.append(tok)
    for span in INLINE.finditer(text):
        line = text.count("\n", 0, span.start()) + 1
        try:
            argv = shlex.split(" ".join(span.group(1).split()).split(" # ")[0])
        except ValueError:
            continue
        if not any(set(tok) <= set(";&|") for tok in argv):
            out.append((line, argv))
    return out


def _strip_env(argv: list[str]) -> list[str]:
    """Drop leading NAME=value assignments and `exec`/`time`/`sudo` words."""
    i = 0
    while i < len(argv) and (
        re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[i]) or argv[i] in {"exec", "time"}
    ):
        i += 1
    return argv[i:]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def check_searchrl(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """None when `searchrl <argv>` names real subcommands and flags, else what is wrong."""
    words = ["searchrl"]
    rest = argv
    while rest and not rest[0].startswith("-"):
        subs = _subparsers(parser)
        if not subs:
            break
        if rest[0] not in subs:
            if re.fullmatch(r"[a-z][a-z0-9-]*", rest[0]) and not subs.keys() & {"paths"}:
                return f"{' '.join(words)} has no subcommand {rest[0]!r} (it has {', '.join(sorted(subs))})"
            break
        parser = subs[rest[0]]
        words.append(rest[0])
        rest = rest[1:]
    takes_value = {opt for action in parser._actions if action.nargs != 0 for opt in action.option_strings}
    skip = False
    for tok in rest:
        flag = tok.split("=", 1)[0]
        if skip:  # the value of the option before, e.g. --sglang-args '--mem-fraction-static 0.6'
            skip = False
            continue
        if tok.startswith("--") and flag not in takes_value | _options(parser) and flag != "--":
            return f"{' '.join(words)} has no option {flag}"
        skip = flag in takes_value and "=" not in tok
    return None


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:(?!=)", text, re.M))
    for line in re.findall(r"^\.PHONY:(.*)$", text, re.M):
        targets.update(line.split())
    return targets


def _problems() -> list[str]:
    parser = build_parser()
    targets = _make_targets()
    problems: list[str] = []
    for path in DOCS:
        rel = path.relative_to(REPO)
        for line, argv in _commands(path):
            argv = _strip_env(argv)
            if not argv:
                continue
            prog = argv[0]
            where = f"{rel}:{line}: {' '.join(argv)[:80]}"
            if prog in {"searchrl", ".venv/bin/searchrl"}:
                why = check_searchrl(argv[1:], parser)
                if why:
                    problems.append(f"{where}: {why}")
            elif prog == "make":
                for word in argv[1:]:
                    if word.startswith("-") or "=" in word:
                        continue
                    if word not in targets:
                        problems.append(f"{where}: the Makefile has no target {word!r}")
            elif (
                prog == "pytest"
                or (
                    prog in {"python", "python3"}
                    and argv[1:2] == ["-m"]
                    and argv[2:3]
                    and argv[2].startswith(OUR_MODULES)
                )
                or (prog in {"pip", "pip3"} and "install" in argv)
            ):
                problems.append(
                    f"{where}: bare {prog} is the system one without an activated venv: use .venv/bin/{prog}"
                )
    return problems


def test_documented_commands_exist() -> None:
    problems = _problems()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("argv", "wrong"),
    [
        (["serve", "--backend", "bm25", "--port", "8000"], None),
        (["sky", "validate", "--env", "A=1"], None),
        (["index", "build", "--index-type", "Flat"], None),
        (["serve", "--backedn", "bm25"], "searchrl serve has no option --backedn"),
        (["sky", "valdiate"], "searchrl sky has no subcommand 'valdiate'"),
    ],
)
def test_checker_catches_what_it_should(argv: list[str], wrong: str | None) -> None:
    why = check_searchrl(argv, build_parser())
    assert (why is None) if wrong is None else (why is not None and why.startswith(wrong))


def test_extracts_continuations_and_chains(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("```bash\nA=1 searchrl serve \\\n  --port 1 &  # c\nmake test && make check\n```\n")
    assert [argv for _, argv in _commands(doc)] == [
        ["A=1", "searchrl", "serve", "--port", "1"],
        ["make", "test"],
        ["make", "check"],
    ]


# Upstream commands that are gone: huggingface_hub's CLI is `hf` now, and SkyPilot replaced --cloud by --infra.
RETIRED = {
    re.compile(r"huggingface-cli"): "use `hf download` (huggingface_hub renamed its CLI)",
    re.compile(
        r"(?<![\w-])--cloud(?![\w-])"
    ): "use --infra (SkyPilot dropped --cloud from its documented flags)",
}


def test_no_retired_upstream_commands() -> None:
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "*.md", "*.py", "*.yaml", "*.yml", "Makefile", "*.sh", "*.toml", "Dockerfile*"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for name in files:
        path = REPO / name
        if path == Path(__file__) or not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{name}:{lineno}: {why}" for pattern, why in RETIRED.items() if pattern.search(line)]
    assert not found, "\n".join(found)
