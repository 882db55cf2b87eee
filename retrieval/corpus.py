"""Search-R1 JSONL corpora: streaming reader, checksum, and a document store with O(1) row lookup.

A corpus row is one JSON object per line, `{"id": "...", "contents": "\\"Title\\"\\nText..."}` (wiki-18 has
21,015,324 of them in ~14 GB), so everything here streams line by line and never parses the whole file.

The document store keeps only an int64 array of byte offsets (saved as `.npy`, memory-mapped), and reads a
row with one `os.pread` + `json.loads`; it opens in milliseconds whatever the corpus size, where loading the
JSONL through HF `datasets` (what Search-R1's server does) takes minutes and tens of GB for wiki-18.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from pydantic_core import from_json

from searchrl.errors import CorpusError
from searchrl.retrieval.schemas import ScoredDocument

log = logging.getLogger(__name__)

# Files up to this size are hashed whole; larger ones are sampled (see corpus_checksum).
_FULL_HASH_LIMIT = 64 * 1024 * 1024
_SAMPLE_BLOCKS = 256
_SAMPLE_BLOCK_SIZE = 64 * 1024


@dataclass(frozen=True)
class Passage:
    """One corpus row. `contents` is Search-R1's `"Title"\\ntext`, kept verbatim for the wire format."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        head, _, _ = self.contents.partition("\n")
        return head.strip().strip('"')

    @property
    def text(self) -> str:
        head, sep, rest = self.contents.partition("\n")
        return rest if sep else head


def parse_row(raw: bytes | str, path: Path | str, lineno: int) -> Passage:
    """Parse one JSONL line into a Passage; CorpusError names `path:line` and what is wrong.

    pydantic-core's parser first: 6x faster than `json.loads` on a 100-word row, and the service parses three
    rows per query on its batch thread (issue 14); `json.loads` then words the error for a bad row.
    """
    try:
        row = from_json(raw)
    except ValueError:
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorpusError(
                f"{path}:{lineno}: not valid JSON ({exc}); each line must be one JSON object"
            ) from None
    if not isinstance(row, dict):
        raise CorpusError(f'{path}:{lineno}: expected a JSON object with "id" and "contents"')
    contents = row.get("contents")
    if not isinstance(contents, str):
        raise CorpusError(f'{path}:{lineno}: "contents" is missing or not a string')
    doc_id = row.get("id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise CorpusError(f'{path}:{lineno}: "id" is missing or not a string')
    return Passage(id=str(doc_id), contents=contents)


def _open_binary(path: Path) -> IO[bytes] | gzip.GzipFile:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")  # noqa: SIM115 - returned to a `with` at the caller


def _check_exists(path: Path) -> None:
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist; give a Search-R1 JSONL(.gz) path or 'bundled'")


def iter_passages(path: Path | str) -> Iterator[Passage]:
    """Yield the passages of a JSONL or JSONL.gz file in order; blank lines are skipped."""
    path = Path(path)
    _check_exists(path)
    with _open_binary(path) as f:
        try:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    yield parse_row(raw, path, lineno)
        except (OSError, EOFError) as exc:  # truncated or corrupt gzip
            raise CorpusError(f"{path}: cannot read ({exc})") from None


def iter_rows_with_offsets(path: Path | str) -> Iterator[tuple[int, int, Passage]]:
    """Yield (start byte, end byte, passage) for each row of a plain JSONL file (the doc store's input)."""
    path = Path(path)
    _check_exists(path)
    if path.suffix == ".gz":
        raise CorpusError(f"{path}: a document store needs a seekable file; decompress it first (gunzip -k)")
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if raw.strip():
                yield start, offset, parse_row(raw, path, lineno)


def count_rows(path: Path | str) -> int:
    """Number of newline-terminated (or final) lines, counted in blocks; cheap even for 14 GB.

    Blank lines are counted too, so this is an upper bound used for progress bars only.
    """
    path = Path(path)
    _check_exists(path)
    n = 0
    last = b"\n"
    with _open_binary(path) as f:
        while block := f.read(16 * 1024 * 1024):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)


def corpus_checksum(path: Path | str) -> str:
    """A content fingerprint that index manifests record, so an index is never served over another corpus.

    Files up to 64 MiB are hashed whole (`sha256:<hex>`). Larger ones hash their size plus 256 evenly spaced
    64 KiB blocks, first and last included (`sha256-sampled:<hex>`): 16 MiB of reads instead of 14 GB, so
    the check costs milliseconds at every service start. Together with the row count in the manifest this
    catches a different, truncated or re-ordered corpus; it is not a defence against deliberate tampering.
    """
    path = Path(path)
    _check_exists(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _FULL_HASH_LIMIT:
            while block := f.read(1024 * 1024):
                h.update(block)
            return f"sha256:{h.hexdigest()}"
        h.update(str(size).encode())
        span = size - _SAMPLE_BLOCK_SIZE
        for i in range(_SAMPLE_BLOCKS):
            f.seek(span * i // (_SAMPLE_BLOCKS - 1))
            h.update(f.read(_SAMPLE_BLOCK_SIZE))
    return f"sha256-sampled:{h.hexdigest()}"


def save_offsets(offsets: Sequence[int] | np.ndarray, path: Path | str) -> None:
    """Write the offsets array: N row starts plus the end of the last row (N + 1 int64 values)."""
    np.save(Path(path), np.asarray(offsets, dtype=np.int64), allow_pickle=False)


def build_offsets(corpus_path: Path | str, offsets_path: Path | str) -> int:
    """Scan a corpus (validating every row) and write its offsets file; returns the row count."""
    offsets: list[int] = []
    end = 0
    for start, stop, _ in iter_rows_with_offsets(corpus_path):
        offsets.append(start)
        end = stop
    offsets.append(end)
    save_offsets(offsets, offsets_path)
    return len(offsets) - 1


class DocStore:
    """Random access to corpus rows by row number (the FAISS/BM25 id), backed by the JSONL file itself.

    Thread-safe: reads use `os.pread`, which carries its own offset, so concurrent lookups need no lock.
    """

    def __init__(self, corpus_path: Path | str, offsets: np.ndarray) -> None:
        self.path = Path(corpus_path)
        if offsets.ndim != 1 or len(offsets) < 1:
            raise CorpusError(f"{self.path}: offsets array is malformed (shape {offsets.shape})")
        self._offsets = offsets
        # Index a plain ndarray view of the same (memory-mapped) buffer: np.memmap's Python-level __getitem__
        # and __array_finalize__ cost ~20 us per lookup, most of a hit's time on the batch thread (issue 14).
        self._starts = offsets.view(np.ndarray)
        self._fd = os.open(self.path, os.O_RDONLY)
        self._lock = threading.Lock()  # only for platforms without os.pread
        size = os.fstat(self._fd).st_size
        if int(offsets[-1]) > size:
            os.close(self._fd)
            raise CorpusError(
                f"{self.path}: offsets point past the end of the file ({int(offsets[-1])} > {size} bytes); "
                "the corpus changed after the index was built"
            )

    @classmethod
    def open(cls, corpus_path: Path | str, offsets_path: Path | str) -> DocStore:
        """Memory-map the offsets file; cost is independent of corpus size."""
        corpus_path = Path(corpus_path)
        _check_exists(corpus_path)
        try:
            offsets = np.load(Path(offsets_path), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CorpusError(f"cannot read offsets file {offsets_path} ({exc})") from None
        return cls(corpus_path, offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _read(self, start: int, length: int) -> bytes:
        if hasattr(os, "pread"):
            return os.pread(self._fd, length, start)
        with self._lock:  # pragma: no cover - non-POSIX fallback
            os.lseek(self._fd, start, os.SEEK_SET)
            return os.read(self._fd, length)

    def get(self, row: int) -> Passage:
        """The passage at `row` (0-based, as the index numbers them)."""
        n = len(self)
        if not 0 <= row < n:
            raise IndexError(f"row {row} out of range for a corpus of {n} passages")
        start = int(self._starts[row])
        end = int(self._starts[row + 1])
        raw = self._read(start, end - start)
        # The row ends at its newline; blank lines that follow belong to the gap before the next row.
        line = raw.split(b"\n", 1)[0]
        return parse_row(line, self.path, row + 1)

    def get_many(self, rows: Sequence[int]) -> list[Passage]:
        return [self.get(int(r)) for r in rows]

    def hits(
        self, rows: Sequence[Sequence[int]], scores: Sequence[Sequence[float]]
    ) -> list[list[ScoredDocument]]:
        """An index's answer (row numbers and scores, one list per query) as documents, best first.

        Rows below 0 are FAISS's "no result" (approximate index types can return fewer than k) and are dropped.
        One `model_validate` of a dict per hit: pydantic-core builds both models in one call (measured here:
        ~30% less than two constructors; `model_construct` is slower still, it runs in Python).
        """
        validate = ScoredDocument.model_validate
        out: list[list[ScoredDocument]] = []
        for qrows, qscores in zip(rows, scores, strict=True):
            hits = []
            for row, score in zip(qrows, qscores, strict=True):
                if row >= 0:
                    p = self.get(int(row))
                    doc = {"id": p.id, "contents": p.contents}
                    hits.append(validate({"document": doc, "score": float(score)}))
            out.append(hits)
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DocStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the real API
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110
            pass


def write_jsonl(passages: Sequence[Passage] | Iterator[Passage], path: Path | str) -> int:
    """Write passages as Search-R1 JSONL atomically (temp file + rename); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False))
            f.write("\n")
            n += 1
    os.replace(tmp, path)
    return n


__all__ = [
    "DocStore",
    "Passage",
    "build_offsets",
    "corpus_checksum",
    "count_rows",
    "iter_passages",
    "iter_rows_with_offsets",
    "parse_row",
    "save_offsets",
    "write_jsonl",
]
