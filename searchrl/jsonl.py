"""Reading a JSON-lines file: each non-blank line one row, with its line number for messages.

One reader for the QA files eval loads and the journal a run appends to; each caller says what a line that is
not JSON means (a bad QA file stops with `path:line`; a journal line cut by a kill is skipped and run again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def jsonl_rows(
    path: Path, bad_line: Callable[[int, json.JSONDecodeError], None]
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) for each non-blank line of `path`, in order. A line that is not JSON goes to
    `bad_line(line number, error)`: it raises to stop the read, or returns to skip the line."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                bad_line(lineno, exc)
                continue
            yield lineno, row


__all__ = ["jsonl_rows"]
