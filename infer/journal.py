"""The files an eval run writes: the resume journal `<label>-<hash>.jsonl` and the result `<label>-<hash>.json`.

Each question's record is appended to the journal as it finishes, so a killed run resumes where it stopped when the
same command runs again: `resume` reads back what a run of the same protocol wrote (its header line names the
protocol hash; a journal of another protocol is refused) and, with `--retry-failed`, drops the failed records so
those questions run again. The protocol hash in both names keeps a changed protocol from overwriting an older run.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchrl.errors import DataError
from searchrl.infer.summary import failed, question_key, run_label
from searchrl.jsonl import jsonl_rows

log = logging.getLogger(__name__)


def slugify(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-").lower() or "run"


def result_paths(protocol: dict[str, Any], output_dir: Path) -> tuple[Path, Path]:
    """(`<label>-<hash>.json`, `<label>-<hash>.jsonl`): a changed protocol never overwrites an older run."""
    stem = f"{slugify(str(protocol['label']))}-{protocol['protocol_hash']}"
    return output_dir / f"{stem}.json", output_dir / f"{stem}.jsonl"


def drop_failed(path: Path, done: dict[str, dict[str, Any]]) -> list[str]:
    """`--retry-failed`: remove the failed records from `done` and their lines from `path` (atomically).

    The re-run questions append new lines; until they do, they are simply not done, so a retry killed
    half-way resumes like any run.
    """
    retry = [k for k, rec in done.items() if failed(rec)]
    if not retry:
        return []
    lines = [
        json.dumps(row, ensure_ascii=False) + "\n"
        for _, row in jsonl_rows(path, lambda lineno, exc: None)  # a line cut by a kill is dropped
        if "protocol_hash" in row or question_key(row) not in retry
    ]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)
    for k in retry:
        del done[k]
    return retry


def read_progress(path: Path, protocol: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Records already written by an interrupted run of the same protocol, by question key (last line wins)."""
    if not path.exists():
        return {}

    def half_written(lineno: int, exc: json.JSONDecodeError) -> None:
        log.warning("%s:%d: a half-written line (killed mid-write); that question runs again", path, lineno)

    done: dict[str, dict[str, Any]] = {}
    for _, row in jsonl_rows(path, half_written):
        if "protocol_hash" in row:
            if row["protocol_hash"] != protocol["protocol_hash"]:
                raise DataError(f"{path} belongs to another protocol; delete it or change --output-dir")
            continue
        done[question_key(row)] = row
    return done


def resume(path: Path, protocol: dict[str, Any], *, retry_failed: bool) -> dict[str, dict[str, Any]]:
    """The records a run of this protocol already wrote to `path`, less the failed ones with `retry_failed`."""
    done = read_progress(path, protocol)
    if retry_failed and done:
        retried = drop_failed(path, done)
        log.info("--retry-failed: %d failed question(s) run again", len(retried))
    return done


@contextmanager
def open_journal(
    path: Path, protocol: dict[str, Any], *, resumed: bool
) -> Iterator[Callable[[dict[str, Any]], None]]:
    """The journal opened for appending, as a function that writes one record and flushes it.

    A new journal starts with a header line naming the protocol, which `read_progress` checks on resume.
    """
    torn = path.exists() and not path.read_bytes().endswith(b"\n")
    with path.open("a", encoding="utf-8") as sink:
        if torn:  # a run killed mid-write left half a line: start ours on a fresh one
            sink.write("\n")
        if not resumed and sink.tell() == 0:
            sink.write(
                json.dumps({"protocol_hash": protocol["protocol_hash"], "label": protocol["label"]}) + "\n"
            )
            sink.flush()

        def append(record: dict[str, Any]) -> None:
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()

        yield append


def write_result(result: dict[str, Any], output_dir: Path) -> Path:
    """Write a result document under its protocol-hashed name (evaluate() already does this for its runs)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path, _ = (
        result_paths(result["protocol"], output_dir)
        if "protocol_hash" in result["protocol"]
        else (
            output_dir / f"{slugify(run_label(result))}.json",
            None,
        )
    )
    doc = {k: v for k, v in result.items() if k != "path"}
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    return path


__all__ = [
    "drop_failed",
    "open_journal",
    "read_progress",
    "result_paths",
    "resume",
    "slugify",
    "write_result",
]
