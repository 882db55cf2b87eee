"""Benchmarks live outside the service package: what runs in production is `retrieval/` alone."""

from __future__ import annotations

import ast
from pathlib import Path

from searchrl import retrieval

RETRIEVAL = Path(retrieval.__file__).parent


def test_service_package_never_imports_benchmarks() -> None:
    offenders = []
    for path in sorted(RETRIEVAL.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("searchrl.bench")]
    assert offenders == []
    assert not (RETRIEVAL / "bench.py").exists() and not (RETRIEVAL / "index_eval.py").exists()
