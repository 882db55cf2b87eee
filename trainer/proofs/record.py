"""A CPU run's record, `<out>/run.json`: what the run measured and its verdict, written by the run itself, read by the
tests (and any tool) instead of the prose lines it prints, which stay for people (issue 54 item 1).

    {"run": "learn-cpu", "passed": true, "verdict": "passed", "figures": {...}}

`verdict` is "passed" or the one line the run failed with. Figures are JSON numbers; a figure the run could not
measure (NaN) is null, so the file is strict JSON any reader takes.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

RECORD = "run.json"
PASSED = "passed"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def record_text(run: str, verdict: str | None, figures: Mapping[str, Any]) -> str:
    """The text of a run's `run.json`; `verdict` None when the run passed, else its failing line. The run writes
    it into its own folder (its file named RECORD there)."""
    record = {"run": run, "passed": verdict is None, "verdict": verdict or PASSED, "figures": _plain(figures)}
    return json.dumps(record, indent=2, allow_nan=False) + "\n"


def write_record(out_dir: Path, run: str, verdict: str | None, figures: Mapping[str, Any]) -> Path:
    """Write `<out_dir>/run.json` (`record_text`)."""
    path = out_dir / RECORD
    path.write_text(record_text(run, verdict, figures), encoding="utf-8")
    return path


@contextlib.contextmanager
def recorded(out_dir: Path, run: str, figures: Callable[[], Mapping[str, Any]]) -> Iterator[None]:
    """Write `<out_dir>/run.json` when the block ends: passed when it returns, else the line that stopped it (a
    SIGTERM's too), with the figures it had by then; the exception goes on."""
    try:
        yield
    except BaseException as exc:
        write_record(out_dir, run, str(exc) or type(exc).__name__, figures())
        raise
    write_record(out_dir, run, None, figures())


def read_record(out_dir: Path) -> dict[str, Any]:
    """The record a run wrote in `out_dir` (FileNotFoundError when it wrote none)."""
    record: dict[str, Any] = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))
    return record


__all__ = ["PASSED", "RECORD", "read_record", "record_text", "recorded", "write_record"]
