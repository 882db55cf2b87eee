"""retrieval/'s rooms hold (issue 54 item 4): each room imports only the rooms it is built on, the service is started
only by its entry point, and what the trainer and infer load is the client room, which pulls no faiss or torch.

The rooms, and what each may import besides itself and the shared modules at retrieval/'s top (settings, schemas,
corpus, queries, heap, process), which import no room:

    client/    nothing else                 what calls a running service; all the trainer and infer load
    encoders/  nothing else                 text -> vectors, and the measurements that pick how
    index/     encoders/                    build, download, convert, copy (recall.py also backends/: it measures them)
    backends/  encoders/, index/, serving/  the search behind /retrieve
    serving/   backends/, api/              the service `searchrl serve` runs
    api/       backends/, serving/          the app's parts

Outside retrieval/, only `searchrl serve` (searchrl/cli/serve.py) imports serving/ or api/. Every import counts,
module level and inside functions alike, read with `ast` (tests/trainer/test_rooms.py's reader); and retrieval/'s
modules import each other without a cycle, so `client` and `health` cannot import each other again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.trainer.test_rooms import imports_of, product_modules

RETRIEVAL = "searchrl.retrieval"
TOP = REPO / "retrieval"
# the modules at retrieval/'s top, each shared by several rooms (a new module goes into a room, or here with why)
SHARED = {
    "settings": "RetrievalSettings: every room reads the service's knobs",
    "schemas": "the /retrieve wire format: the service renders it, the client reads it",
    "corpus": "Search-R1 JSONL and the document store: index builds, the build encoder's timing, the backends",
    "queries": "realistic queries: the encoder gate (encoders/), conversion questions (index/), the benchmarks",
    "heap": "freed heap back to the OS: the batcher, the dense backend, the conversion",
    "process": "`searchrl serve` as a child process: smoke, CPU runs, benchmarks and live tests start it",
}
MAX_TOP_MODULES = 16  # .py files at retrieval/'s top, __init__.py included
# room -> the other rooms it may import (the shared modules are open to all)
MAY_IMPORT: dict[str, set[str]] = {
    "shared": set(),
    "client": set(),
    "encoders": set(),
    "index": {"encoders"},
    "backends": {"encoders", "index", "serving"},
    "serving": {"backends", "api"},
    "api": {"backends", "serving"},
}
ROOMS = tuple(room for room in MAY_IMPORT if room != "shared")
# one module's extra room, with why
EXCEPTIONS = {
    (
        "searchrl.retrieval.index.recall",
        "backends",
    ): "recall@k is measured on the backends the service would serve",
}
SERVICE_ROOMS = ("serving", "api")
# product modules outside retrieval/ that may import the service rooms, with why
SERVICE_ENTRY_POINTS = {"searchrl.cli.serve": "`searchrl serve` starts the service (serving/server.py)"}
# what verl loads by name in its Ray workers, and what an inference run loads: these reach only the client room
CLIENT_SIDE_ROOTS = (
    "searchrl.trainer.plugins",
    "searchrl.trainer.weight_sync",
    "searchrl.trainer.settings",
    "searchrl.trainer.toolconfig",
    "searchrl.infer.agent",
    "searchrl.infer.evaluate",
)
# distributions the client room must never load: the index, the encoders, the service
HEAVY = (
    "faiss",
    "torch",
    "numpy",
    "transformers",
    "onnxruntime",
    "bm25s",
    "pyarrow",
    "scipy",
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "selectolax",
    "huggingface_hub",
)


def room_of(module: str) -> str | None:
    """The room of a retrieval module ("shared" for the top's), or None for the package itself or a name outside."""
    if not module.startswith(RETRIEVAL + "."):
        return None
    head = module.split(".")[2]
    return head if head in ROOMS else "shared" if head in SHARED else None


def retrieval_modules() -> dict[str, Path]:
    return {name: path for name, path in product_modules().items() if name.startswith(RETRIEVAL)}


def room_breaches(module: str, source: str, is_package: bool = False) -> list[str]:
    """The rooms `module` (in retrieval/) imports where it may not."""
    room = room_of(module)
    allowed = {room, "shared", *MAY_IMPORT.get(room or "", set())}
    found = {room_of(name) for name in imports_of(source, module, is_package)} - {None}
    extra = {r for r in found - allowed if (module, r) not in EXCEPTIONS}
    return sorted(f"imports {r}/" for r in extra if r is not None)


def test_the_top_holds_only_the_shared_modules_and_the_rooms():
    top = {p.stem for p in TOP.glob("*.py")}
    assert top == {"__init__", *SHARED}, sorted(top ^ {"__init__", *SHARED})
    assert len(top) <= MAX_TOP_MODULES
    folders = {p.parent.relative_to(TOP).parts[0] for p in TOP.rglob("*.py") if p.parent != TOP}
    assert folders - {"__pycache__"} == set(ROOMS)
    assert all((TOP / room / "__init__.py").is_file() for room in ROOMS)


def test_each_room_imports_only_the_rooms_it_is_built_on():
    modules = retrieval_modules()
    assert len(modules) > 60 and "searchrl.retrieval.client.client" in modules  # the walk found the tree
    assert all(room_of(name) for name in modules if name != RETRIEVAL), "a module outside every room"
    breaches = {
        name: found
        for name, path in modules.items()
        if (found := room_breaches(name, path.read_text(), path.name == "__init__.py"))
    }
    assert not breaches, f"{breaches}: the rooms and what each may import are in this file's docstring"


def test_each_exception_is_still_needed():
    modules = retrieval_modules()
    for (name, room), why in EXCEPTIONS.items():
        assert why and name in modules, name
        path = modules[name]
        assert room in {room_of(n) for n in imports_of(path.read_text(), name)}, (
            f"{name} no longer needs {room}/"
        )


def test_retrieval_modules_import_each_other_without_a_cycle():
    """A cycle ties two modules into one job (client <-> health did: one imported the other to re-export it)."""
    modules = retrieval_modules()
    graph = {
        name: sorted(
            n for n in imports_of(path.read_text(), name, path.name == "__init__.py") if n in modules
        )
        for name, path in modules.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = 1
        for nxt in graph[name]:
            if state.get(nxt) == 1:
                return [*path, name, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, name])):
                return cycle
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state and (cycle := visit(name, [])):
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
    # health checks with the client, one way: the client no longer imports health to re-export it
    assert "searchrl.retrieval.client.health" not in graph["searchrl.retrieval.client.client"]


def test_only_the_entry_point_imports_the_service_from_outside_retrieval():
    breaches, needed = {}, set()
    for name, path in product_modules().items():
        if name.startswith(RETRIEVAL):
            continue
        served = sorted(n for n in imports_of(path.read_text(), name) if room_of(n) in SERVICE_ROOMS)
        if served and name in SERVICE_ENTRY_POINTS:
            needed.add(name)
        elif served:
            breaches[name] = served
    assert not breaches, (
        f"{breaches}: only `searchrl serve` starts the service; use process.py for a child server"
    )
    assert needed == set(SERVICE_ENTRY_POINTS), "an entry point no longer imports the service: drop it"


def test_what_verl_and_inference_load_reaches_only_the_client_room():
    """verl's tool, reward, agent loop and sampler in every Ray worker, the trainer's settings and the agent loop of
    an inference run: of retrieval/ they reach the client room and schemas.py, nothing that needs faiss or torch."""
    modules = product_modules()
    todo = [name for name in modules if name.startswith(CLIENT_SIDE_ROOTS)]
    assert "searchrl.trainer.plugins.tool" in todo and "searchrl.infer.agent" in todo
    seen: set[str] = set()
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in seen:
                seen.add(prefix)
                path = modules[prefix]
                todo += imports_of(path.read_text(), prefix, path.name == "__init__.py")
    reached = {name for name in seen if name.startswith(RETRIEVAL + ".")}
    assert "searchrl.retrieval.client.client" in reached
    outside = sorted(n for n in reached if room_of(n) != "client" and n != f"{RETRIEVAL}.schemas")
    assert not outside, f"{outside}: what verl and inference load reaches retrieval/ beyond the client room"


def test_the_client_room_loads_no_faiss_torch_or_service_in_a_fresh_interpreter():
    """What `import` really loads, third-party packages included: the trainer's Ray workers and every inference
    process import the client room, and must not pay for (or need) the index, the encoders or the service."""
    client = sorted(
        name for name in retrieval_modules() if room_of(name) == "client" or name == f"{RETRIEVAL}.client"
    )
    code = (
        f"import json, sys\nfor m in {client!r}:\n    __import__(m)\nprint(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert not sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    ours = {m for m in loaded if m.startswith(RETRIEVAL + ".")}
    assert {room_of(m) for m in ours} == {"client", "shared"}
    assert {m for m in ours if room_of(m) == "shared"} == {f"{RETRIEVAL}.schemas"}


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("searchrl.retrieval.client.hits", "from searchrl.retrieval.index.build import ensure_index\n"),
        ("searchrl.retrieval.client.health", "def f():\n    from searchrl.retrieval.serving import app\n"),
        ("searchrl.retrieval.encoders.tuning", "from ..index import build\n"),
        ("searchrl.retrieval.encoders.pool", "import searchrl.retrieval.backends.dense as d\n"),
        ("searchrl.retrieval.index.build", "from searchrl.retrieval import backends\n"),
        ("searchrl.retrieval.corpus", "from searchrl.retrieval.encoders.encoder import Encoder\n"),
        ("searchrl.retrieval.serving.batcher", "from searchrl.retrieval.client import RetrievalClient\n"),
    ],
    ids=["from", "in-a-function", "relative", "import-as", "from-package", "shared", "service-to-client"],
)
def test_the_reader_catches_each_way_of_crossing_a_room(module, source):
    """The check itself can fail: each import, put in that module, is a breach."""
    assert room_breaches(module, source)


def test_the_reader_lets_the_allowed_through():
    assert not room_breaches("searchrl.retrieval.index.recall", "from searchrl.retrieval.backends import x\n")
    assert not room_breaches(
        "searchrl.retrieval.index.convert", "from searchrl.retrieval.encoders import encoder\n"
    )
    assert not room_breaches(
        "searchrl.retrieval.client.hits", "from searchrl.retrieval.schemas import Document\n"
    )
    assert not room_breaches(
        "searchrl.retrieval.client.hits", '"""searchrl.retrieval.serving.app, in prose"""\n'
    )
