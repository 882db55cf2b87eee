"""The bundled dev QA set: 30 questions over the bundled corpus, shipped inside the package.

It is package data, not a test fixture, because production reads it: the encoder quality gate's query list,
`searchrl eval --qa dev`, `searchrl smoke`, `searchrl index recall` and the CPU training runs. Reading it
through `tests/` worked in a checkout and silently dropped the questions in the Docker image, which copies no
tests (issue 33, bug 2). Everything reaches the file through `dev_qa_path()`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def dev_qa_path() -> Path:
    """The dev set's JSONL file, wherever the package is installed (editable, wheel or image)."""
    return Path(str(files("searchrl") / "data" / "dev_qa.jsonl"))


__all__ = ["dev_qa_path"]
