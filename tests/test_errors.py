"""searchrl/errors.py is the one exception hierarchy: its drawn tree is the real one, and nothing lives elsewhere.

`__all__` is exact in every public module (httpx's tests/test_exported_members.py does this for its package):
every public name is listed and nothing listed is missing. The public modules are searchrl/errors.py and the rest
of the bottom layer, searchrl/*.py (`__main__` aside: an entry point, not imported): every room and the CLI
import them, so what they export is their contract. A module's public names are the classes, functions and
assigned names it defines at top level, without a leading underscore, except `log` (each module's logger, STYLE
section 5). Names it imports are not its own, but may be re-exported by listing them.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

from searchrl import errors
from tests.conftest import REPO

# `Name` or `Name(Builtin, ...)` after the tree's connector; the description follows
_NODE = re.compile(
    r"^(?P<indent>(?:│   |    )*)(?P<branch>├── |└── )(?P<name>\w+)(?:\((?P<mixins>[\w, ]+)\))?\s"
)
_BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
# Exception classes that stay outside errors.py on purpose (errors.py's docstring says why): trainer/node/nvidia_driver.py
# runs with the system python before anything of ours is installed. Private classes (a leading underscore) never
# leave their module, so they are no part of the tree either.
_ELSEWHERE = {
    ("trainer/node/nvidia_driver.py", "DriverError"),
    ("trainer/node/stack_check.py", "StackError"),
    ("trainer/cpu/vllm_env.py", "WheelError"),
}


def _drawn_tree() -> list[tuple[str, str | None, tuple[str, ...], bool]]:
    """(class, drawn parent, drawn built-in mixins, drawn as its parent's last child) for each line of the tree."""
    doc = errors.__doc__ or ""
    lines = doc.split("\n\n")[1].splitlines()
    assert lines[0].strip() == "SearchRLError", lines[0]
    nodes: list[tuple[str, str | None, tuple[str, ...], bool]] = [("SearchRLError", None, (), True)]
    stack = ["SearchRLError"]  # the path from the root to the last node drawn
    for line in lines[1:]:
        match = _NODE.match(line.removeprefix("    "))
        assert match, f"not a tree line: {line!r}"
        depth = len(match["indent"]) // 4 + 1
        assert depth <= len(stack), f"{match['name']} is drawn deeper than a parent: {line!r}"
        del stack[depth:]
        mixins = tuple(m.strip() for m in (match["mixins"] or "").split(",") if m.strip())
        nodes.append((match["name"], stack[-1], mixins, match["branch"] == "└── "))
        stack.append(match["name"])
    return nodes


def _exception_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    nodes = _drawn_tree()
    drawn = [name for name, *_ in nodes]
    assert len(drawn) == len(set(drawn)), "a class is drawn twice"
    assert sorted(drawn) == sorted(
        _exception_classes()
    )  # every class drawn, nothing drawn that is not a class
    children: dict[str | None, list[str]] = {}
    for name, parent, mixins, _last in nodes:
        cls = getattr(errors, name)
        expected = [parent, *mixins] if parent else ["Exception"]
        assert [base.__name__ for base in cls.__bases__] == expected, name
        children.setdefault(parent, []).append(name)
    for name, parent, _mixins, last in nodes[1:]:
        assert last == (children[parent][-1] == name), f"{name}: └── marks exactly the last child"


def test_every_exception_class_lives_in_errors_py() -> None:
    """AST over every module of ours, so nothing heavy is imported: a class whose base is a built-in exception,
    one of ours, or a name ending in Error/Exception is an exception class."""
    ours = set(_exception_classes())
    elsewhere = []
    folders = ("searchrl", "retrieval", "trainer", "infer")
    for path in sorted(p for folder in folders for p in (REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "searchrl/errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if (
                not isinstance(node, ast.ClassDef)
                or node.name.startswith("_")
                or (rel, node.name) in _ELSEWHERE
            ):
                continue
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if bases & (_BUILTIN_EXCEPTIONS | ours) or any(b.endswith(("Error", "Exception")) for b in bases):
                elsewhere.append(f"{rel}: {node.name}")
    assert not elsewhere, f"move these into searchrl/errors.py and its tree: {elsewhere}"


def _public_modules() -> list[str]:
    return sorted(
        "searchrl" if path.stem == "__init__" else f"searchrl.{path.stem}"
        for path in (REPO / "searchrl").glob("*.py")
        if path.stem != "__main__"
    )


def _defined_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


@pytest.mark.parametrize("module", _public_modules())
def test_all_is_exact(module: str) -> None:
    mod = importlib.import_module(module)
    listed = getattr(mod, "__all__", None)
    assert listed is not None, f"{module} has no __all__"
    assert len(listed) == len(set(listed)), f"{module}.__all__ lists a name twice"
    assert [name for name in listed if not hasattr(mod, name)] == [], (
        f"{module}.__all__ lists what is not there"
    )
    path = Path(mod.__file__ or "")
    public = {n for n in _defined_names(path) if not n.startswith("_") and n != "log"}
    assert sorted(public - set(listed)) == [], f"{module} defines public names its __all__ leaves out"
