"""docs/training.md "The pieces" maps every module of trainer/, room by room, and nothing else (issue 47 item 5);
docs/retrieval.md "The pieces" does the same for retrieval/ (issue 54 item 4).

The map is a table whose first column names each module by its path under trainer/ (`plugins/tool.py`), in the
order of the rooms; a room's own row is bold (`**`trainer/`**`). A module added, moved or removed without the
map following fails here, and so does a map row whose module is gone.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

TRAINER = REPO / "trainer"
RETRIEVAL = REPO / "retrieval"
ROW = re.compile(r"^\| `([\w/]+\.(?:py|sh))` \|", re.M)


def pieces(text: str) -> str:
    """The section "The pieces", up to the next second-level heading."""
    start = text.index("\n## The pieces\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def mapped(text: str) -> list[str]:
    return ROW.findall(pieces(text))


def modules(root: Path) -> set[str]:
    """Every module of an area (trainer/, retrieval/): Python files but the packages' __init__.py, and the shell scripts."""
    files = [*root.rglob("*.py"), *root.rglob("*.sh")]
    return {
        p.relative_to(root).as_posix()
        for p in files
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def rooms(root: Path) -> set[str]:
    return {""} | {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}


def map_problems(text: str, root: Path, area: str = "trainer") -> list[str]:
    rows = mapped(text)
    problems = [f"the map names {m} twice" for m in sorted({m for m in rows if rows.count(m) > 1})]
    problems += [f"{area}/{m} is not in the map" for m in sorted(modules(root) - set(rows))]
    problems += [f"the map names {area}/{m}, which does not exist" for m in sorted(set(rows) - modules(root))]
    room_row = re.compile(rf"^\| \*\*`{area}/([\w/]*)`\*\* \|", re.M)
    room_rows = [r.rstrip("/") for r in room_row.findall(pieces(text))]
    problems += [f"room {area}/{r} has no row of its own" for r in sorted(rooms(root) - set(room_rows))]
    return problems


def test_the_module_map_names_every_module_of_trainer_once() -> None:
    assert map_problems((REPO / "docs" / "training.md").read_text(encoding="utf-8"), TRAINER) == []


def test_the_module_map_names_every_module_of_retrieval_once() -> None:
    text = (REPO / "docs" / "retrieval.md").read_text(encoding="utf-8")
    assert map_problems(text, RETRIEVAL, "retrieval") == []


def test_the_map_check_sees_a_missing_a_stale_and_a_doubled_module(tmp_path: Path) -> None:
    for path in ("__init__.py", "launch.py", "new.py", "cpu/__init__.py", "cpu/plugin.py", "node/pins.sh"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("", encoding="utf-8")
    text = (
        "# x\n\n## The pieces\n\n| module | what | where |\n|---|---|---|\n"
        "| **`trainer/`** | **CLI** | |\n| `launch.py` | a | CLI |\n| `gone.py` | b | CLI |\n"
        "| `node/pins.sh` | c | node |\n| `node/pins.sh` | c | node |\n| `cpu/plugin.py` | d | CPU runs |\n"
        "\n## Next\n\n| `new.py` | outside the section | |\n"
    )
    assert map_problems(text, tmp_path) == [
        "the map names node/pins.sh twice",
        "trainer/new.py is not in the map",
        "the map names trainer/gone.py, which does not exist",
        "room trainer/cpu has no row of its own",
    ]
