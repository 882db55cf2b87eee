"""trainer/'s rooms hold (issue 47 item 2): production code never imports the CPU-only rooms, node scripts import
only the standard library, and a GPU run reaches no CPU module; nor does production code name the CPU engine
beyond the engine table (issue 54 item 3).

The rooms `searchrl.trainer.cpu` (what only a CPU run plugs into verl) and `searchrl.trainer.proofs` (the CPU proof
runs) may be imported by each other and by the CLI verbs that start them, nothing else: every import of every
product module (searchrl/, retrieval/, trainer/, infer/) is read with `ast`, module level and inside functions
alike, and so is every string constant that names one of their modules (verl imports plugins by dotted name).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from searchrl.trainer.overrides import VLLM_SYNC_KEY, render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import REPO

# import name prefix -> folder (pyproject.toml's package-dir)
ROOTS = {
    "searchrl": REPO / "searchrl",
    "searchrl.retrieval": REPO / "retrieval",
    "searchrl.trainer": REPO / "trainer",
    "searchrl.infer": REPO / "infer",
}
CPU_ROOMS = ("searchrl.trainer.cpu", "searchrl.trainer.proofs")
# Production modules allowed to import the CPU rooms, each with why; only inside their functions (the handlers), as
# every `searchrl train ...` command, a GPU run's included, imports them to build its parser.
ALLOWED = {
    "searchrl.cli.train_cpu": "the `searchrl train cpu ...` and `train bench-rollout` verbs start the CPU proof runs "
    "and the rollout bench (trainer/proofs/)",
    "searchrl.cli.learn_search": "the `searchrl train learn-search` verb starts make learn-search's run "
    "(trainer/proofs/learn_search.py)",
}
_DOTTED = re.compile(r"searchrl(?:\.\w+)+")


def product_modules() -> dict[str, Path]:
    """Every product module by import name (a package by its own name, from its __init__.py)."""
    modules: dict[str, Path] = {}
    for prefix, folder in ROOTS.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([prefix, *parts])] = path
    return modules


def _nodes(tree: ast.AST, at_import: bool) -> list[ast.AST]:
    """Every node of `tree` (ast.walk visits function bodies too), or with `at_import` only those that run when the
    module is imported (function bodies left out)."""
    if not at_import:
        return list(ast.walk(tree))
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo += list(ast.iter_child_nodes(node))
    return found


def imports_of(source: str, module: str, is_package: bool = False, at_import: bool = False) -> set[str]:
    """Every module name an import statement in `source` names, module level and inside functions alike (or with
    `at_import` only what runs at import); relative imports resolved against `module`; `from a import b` counts a
    and a.b (b may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(source), at_import):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def code_strings(tree: ast.AST) -> list[str]:
    """The string constants of `tree` but its docstrings (prose, not code)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def dotted_names(source: str) -> set[str]:
    """`searchrl.x.y` names in the string constants of `source`, as verl's plugin lists, `pkg://` reward paths and
    registries name modules (docstrings left out: prose, not code)."""
    return {match.group(0) for text in code_strings(ast.parse(source)) for match in _DOTTED.finditer(text)}


def in_cpu_rooms(name: str) -> bool:
    return any(name == room or name.startswith(room + ".") for room in CPU_ROOMS)


def room_breaches(module: str, source: str, is_package: bool = False) -> list[str]:
    """What `module` imports or names from the CPU rooms, where it may not."""
    if in_cpu_rooms(module) or module in ALLOWED:
        return []
    imported = {n for n in imports_of(source, module, is_package) if in_cpu_rooms(n)}
    named = {n for n in dotted_names(source) if in_cpu_rooms(n)}
    return sorted({f"imports {n}" for n in imported} | {f"names {n!r}" for n in named})


def test_no_production_module_imports_the_cpu_rooms():
    modules = product_modules()
    assert len(modules) > 150 and "searchrl.trainer.plugins.agent_loop" in modules  # the walk found the tree
    breaches = {
        name: found
        for name, path in modules.items()
        if (found := room_breaches(name, path.read_text(), path.name == "__init__.py"))
    }
    assert not breaches, (
        f"{breaches}: production code may not reach trainer/cpu/ or trainer/proofs/ (a GPU run would import "
        "them); move the shared part to the production side, or start the CPU run from searchrl/cli/train_cpu.py"
    )


def test_each_allowed_module_needs_its_place_and_imports_the_rooms_only_when_a_verb_runs():
    """A stale allow-list entry would let a later import through unnoticed; an import at module level would load
    the CPU rooms into every `searchrl train` process, a GPU run's included."""
    modules = product_modules()
    for name, why in ALLOWED.items():
        assert why and name in modules, name
        source = modules[name].read_text()
        assert any(in_cpu_rooms(n) for n in imports_of(source, name)), name
        assert not [n for n in imports_of(source, name, at_import=True) if in_cpu_rooms(n)], name


@pytest.mark.parametrize(
    "source",
    [
        "from searchrl.trainer.cpu import sabotage\n",
        "def f():\n    from searchrl.trainer.proofs.train_cpu import cpu_settings\n",
        "import searchrl.trainer.cpu.hf_rollout as h\n",
        "from searchrl.trainer import proofs\n",
        "from ..cpu import sabotage\n",
        "PLUGIN = 'searchrl.trainer.cpu.plugin'\n",
        "class A:\n    async def f(self):\n        import searchrl.trainer.proofs\n",
    ],
    ids=["from", "in-a-function", "import-as", "from-package", "relative", "dotted-string", "async-method"],
)
def test_the_reader_catches_each_way_of_reaching_a_cpu_room(source):
    """The check itself can fail: each form, put in a production module, is a breach (and is none in cpu/)."""
    assert room_breaches("searchrl.trainer.plugins.sampler", source)
    assert not room_breaches("searchrl.trainer.cpu.plugin", source)
    assert not room_breaches(
        "searchrl.trainer.plugins.sampler", '"""searchrl.trainer.cpu.plugin, in prose"""\n'
    )


# Non-standard imports a node script makes inside a function, on a path that runs only where the package is there:
# script -> {top-level name: why}. Anything at module level would fail the script before it starts.
NODE_LATE_IMPORTS = {
    "nvidia_driver.py": {"torch": "`--torch` only, on an image with torch; a missing torch is caught"},
    "refusal.py": {"searchrl": "`--run-dir` only (checkpoint progress): sky's run phase, after the install"},
    # it checks the venv, so it runs with the venv's python; an import failing is its one-line answer
    "stack_check.py": {
        "torch": "`--flash-attn 1`: flash-attn's extension links against torch",
        "packaging": "`--requires`: verl's version ranges (a dependency of verl)",
        "pip": "`--requires` without packaging: pip's vendored copy",
    },
}


def test_node_scripts_import_only_the_standard_library():
    """trainer/node/*.py run by path from sky/*.yaml before any venv exists: a third-party or searchrl import
    fails there, before the run starts; the few late imports inside functions are listed with why."""
    scripts = sorted((REPO / "trainer" / "node").glob("*.py"))
    assert len(scripts) >= 3
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    late: set[tuple[str, str]] = set()
    for path in scripts:
        source = path.read_text()
        relative = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, f"{path.name}: a relative import fails when the script runs by path"
        at_import = {n.split(".")[0] for n in imports_of(source, path.stem, at_import=True)}
        assert at_import <= stdlib, f"{path.name} imports {sorted(at_import - stdlib)} at module level"
        anywhere = {n.split(".")[0] for n in imports_of(source, path.stem)}
        late |= {(path.name, name) for name in anywhere - stdlib}
    listed = {(script, name) for script, names in NODE_LATE_IMPORTS.items() for name in names}
    assert late == listed, sorted(late ^ listed)


def _closure(roots: set[str], modules: dict[str, Path]) -> set[str]:
    """Every product module importing `roots` imports or names by dotted string (what verl imports by name),
    packages' __init__ files included (Python runs them); of an allowed CLI module only what runs at import (its
    handlers are the CPU verbs, which a GPU run never calls)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in seen:
                seen.add(prefix)
                path = modules[prefix]
                source, package = path.read_text(), path.name == "__init__.py"
                todo += sorted(imports_of(source, prefix, package, at_import=prefix in ALLOWED))
                todo += sorted(dotted_names(source) if prefix not in ALLOWED else ())
    return seen


@pytest.mark.parametrize("rollout", ["vllm", "sglang"])
@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_no_gpu_run_reaches_the_cpu_rooms(tmp_path, rollout, mode):
    """What a GPU run imports: `searchrl train local`'s launch path, and in every Ray process the plugin modules
    its overrides name and every module another override names by its dotted path (the reward, the sampler, the
    weight-sync classes). Nothing it reaches is in trainer/cpu/ or trainer/proofs/, and no override names them."""
    extra: dict[str, object] = {"nnodes": 2, "rollout_nodes": 1} if mode == "separate_async" else {}
    if rollout == "sglang":  # a model sglang 0.5.12 can read back (Qwen2 it cannot: settings refuse it)
        extra["model_name"] = "meta-llama/Llama-3.2-3B-Instruct"
    try:
        settings = TrainSettings(
            _env_file=None, data_dir=tmp_path, rollout_name=rollout, trainer_mode=mode, **extra
        )
    except ValueError as exc:  # a combination the settings refuse is no GPU run
        pytest.skip(" ".join(str(exc).split())[:300])
    overrides = render_overrides(settings)
    plugins = next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == VLLM_SYNC_KEY)
    named = {m.group(0) for o in overrides for m in re.finditer(r"searchrl(?:\.\w+)+", o)}
    assert not [n for n in named if in_cpu_rooms(n)], sorted(named)
    roots = {
        "searchrl.cli.train",  # the parser of `searchrl train local`, with the CPU verbs' (not their handlers)
        "searchrl.trainer.launch",
        "searchrl.trainer.lockfiles",
        *plugins.strip("'\"").split(","),
        *named,
    }
    modules = product_modules()
    reached = _closure(roots, modules)
    assert {"searchrl.trainer.plugins.agent_loop", "searchrl.cli.train_cpu"} <= reached
    assert f"searchrl.trainer.weight_sync.{rollout}_sync" in reached
    assert not [n for n in reached if in_cpu_rooms(n)], sorted(n for n in reached if in_cpu_rooms(n))


# --- the rules docs/training.md "The pieces" states for the rooms verl loads (issue 54 item 3) --------------------
# verl imports plugins/, weight_sync/ and patches/ by name in its Ray workers: from the trainer's top room (the CLI
# process's modules) they may take the settings and the engine table, nothing else, and nothing from searchrl.cli.
RAY_ROOMS = ("searchrl.trainer.plugins", "searchrl.trainer.weight_sync", "searchrl.trainer.patches")
RAY_ROOMS_MAY_IMPORT = {"searchrl.trainer.settings", "searchrl.trainer.engines"}


def _in(name: str, rooms: Sequence[str]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def test_the_ray_rooms_import_nothing_from_the_cli_room_but_the_settings():
    modules = product_modules()
    top_room = {
        name
        for name, path in modules.items()
        if name.startswith("searchrl.trainer.")
        and path.parent == REPO / "trainer"
        and path.name != "__init__.py"
    }
    breaches = []
    for name, path in modules.items():
        if not _in(name, RAY_ROOMS):
            continue
        imported = imports_of(path.read_text(), name, path.name == "__init__.py")
        bad = {n for n in imported if n in top_room - RAY_ROOMS_MAY_IMPORT or _in(n, ("searchrl.cli",))}
        breaches += [f"{name} imports {n}" for n in sorted(bad)]
    assert breaches == []


def _runtime(path: Path) -> str:
    """The module's source without its `if TYPE_CHECKING:` blocks (annotations only: no import runs)."""
    tree = ast.parse(path.read_text())
    tree.body = [
        node
        for node in tree.body
        if not (
            isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        )
    ]
    return ast.unparse(tree)


def test_the_trainers_top_room_has_no_import_cycle():
    """launch and smoke_checks imported each other (issue 54): no two modules of the top room reach each other."""
    modules = product_modules()
    top = {
        name: path
        for name, path in modules.items()
        if name.startswith("searchrl.trainer.")
        and path.parent == REPO / "trainer"
        and path.name != "__init__.py"
    }
    graph = {
        name: {n for n in imports_of(_runtime(path), name) if n in top} - {name} for name, path in top.items()
    }

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted({tuple(sorted((a, b))) for a in top for b in graph[a] if a in reach(b)})
    assert cycles == []


def test_the_rules_catch_what_they_forbid():
    assert _in("searchrl.trainer.plugins.tool", RAY_ROOMS) and not _in(
        "searchrl.trainer.toolconfig", RAY_ROOMS
    )
    source = "from searchrl.trainer.toolconfig import SearchToolConfig\n"
    assert "searchrl.trainer.toolconfig" in imports_of(source, "searchrl.trainer.plugins.tool")


# --- a GPU run knows nothing of the CPU engine (issue 54 item 3) --------------------------------------------------
# The production rooms (trainer/'s top level, plugins/, weight_sync/, patches/, node/) name our CPU-only `hf` rollout
# engine (trainer/cpu/hf_rollout.py) in the engine table only, which the settings read to refuse it on a GPU. Its
# log lines, its server actors' name, its `engine_kwargs.hf` block and its version ledger live in trainer/cpu/; our
# own agent-loop keys are `engine_kwargs.searchrl.*` (trainer/plugins/engine_kwargs.py).
HF_ENGINE = "hf"
HF_MARKS = ("searchrl-hf-rollout", "searchrl_hf_rollout", "engine_kwargs.hf", "version_ledger")
# production modules that may name the engine, each with why
NAMES_HF = {
    "searchrl.trainer.engines": "the engine table: `hf` runs on CPU only, and the settings refuse it on GPU"
}


def production_modules() -> dict[str, Path]:
    """trainer/'s modules outside the CPU rooms: what a GPU run may import."""
    return {
        name: path
        for name, path in product_modules().items()
        if name.startswith("searchrl.trainer") and not in_cpu_rooms(name)
    }


def _identifier(node: ast.AST) -> str | None:
    """The name an attribute, a variable or a keyword argument spells; None for any other node."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.keyword):
        return node.arg
    return None


def hf_mentions(source: str) -> list[str]:
    """Where `source` names the hf engine in code: a string constant `"hf"` or one holding an HF_MARKS mark (the
    engine's log prefix, its actor name, its engine_kwargs block, the ledger switch), or an identifier `hf` or
    `version_ledger` (`config.engine_kwargs.hf`, `get(version_ledger=...)`); docstrings and comments are prose."""
    tree = ast.parse(source)
    strings = code_strings(tree)
    found = [
        f"the string {text[:60]!r}"
        for text in strings
        if text == HF_ENGINE or any(m in text for m in HF_MARKS)
    ]
    names = [_identifier(node) for node in ast.walk(tree)]
    found += [
        f"the name {name!r}" for name in names if name == HF_ENGINE or (name and "version_ledger" in name)
    ]
    return found


def test_no_production_module_names_the_cpu_engine():
    modules = production_modules()
    assert "searchrl.trainer.verl_progress" in modules and "searchrl.trainer.cpu.hf_rollout" not in modules
    named = {name: found for name, path in modules.items() if (found := hf_mentions(path.read_text()))}
    breaches = {name: found for name, found in named.items() if name not in NAMES_HF}
    assert not breaches, (
        f"{breaches}: a GPU run's modules may not carry the hf engine's lines, names or keys; move them to "
        "trainer/cpu/ (our agent-loop keys are engine_kwargs.searchrl.*)"
    )
    assert set(NAMES_HF) <= set(named), "a stale NAMES_HF entry would let a later mention through unnoticed"


@pytest.mark.parametrize(
    "source",
    [
        "LINE = 'searchrl-hf-rollout: batch of {n} sequences'\n",
        "NAME = 'searchrl_hf_rollout_{rank}'\n",
        "KEY = '+actor_rollout_ref.rollout.engine_kwargs.hf.turn_max_tokens'\n",
        "def f(c):\n    return c.engine_kwargs.get('hf')\n",
        "def f(c):\n    return c.engine_kwargs.hf.dtype\n",
        "def f(kw):\n    return kw.get('version_ledger') == LEDGER\n",
        "f(version_ledger=1)\n",
    ],
    ids=["log-line", "actor-name", "key", "get-hf", "attribute", "ledger-key", "ledger-keyword"],
)
def test_the_reader_catches_each_way_of_naming_the_cpu_engine(source):
    assert hf_mentions(source)
    assert not hf_mentions(
        '"""The hf engine prints searchrl-hf-rollout lines (engine_kwargs.hf)."""\nHF_CONFIG = 1\n'
    )
