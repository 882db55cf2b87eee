"""`searchrl index copy`: a built index and its corpus, from one data directory (the bucket mount) to another.

The source stands in for the bucket mount: a data dir holding the 20-passage fixture under wiki18-100k's file
name (so the named-corpus layout is exercised without the Hub), with a real bm25s index and a real FAISS Flat
file imported as the downloaded E5 one is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from searchrl.config import load_settings
from searchrl.errors import IndexLoadError
from searchrl.retrieval.encoders.encoder import resolve_encoder
from searchrl.retrieval.index.build import (
    MANIFEST,
    build_bm25_index,
    ensure_index,
    import_faiss_index,
    index_dir_for,
    load_manifest,
)
from searchrl.retrieval.index.copy import copy_index, corpus_relpath
from searchrl.retrieval.index.download import CORPORA
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import REPO, TINY_CORPUS

E5 = "intfloat/e5-base-v2"


def _settings(data_dir: Path, **kw: object) -> RetrievalSettings:
    return load_settings(RetrievalSettings, corpus="wiki18-100k", data_dir=data_dir, **kw)


@pytest.fixture
def bucket(tmp_path: Path) -> Path:
    """A data dir as sky/index-build.yaml leaves the bucket: corpus, bm25 index, dense (E5-shaped Flat) index."""
    import faiss

    root = tmp_path / "bucket"
    corpus = root / "corpora" / CORPORA["wiki18-100k"].local_name
    corpus.parent.mkdir(parents=True)
    shutil.copy(TINY_CORPUS, corpus)
    bm25_dir = index_dir_for(_settings(root), "bm25", corpus)
    bm25_dir.parent.mkdir(parents=True)
    build_bm25_index(corpus, bm25_dir)
    vectors = np.random.default_rng(0).standard_normal((20, 768), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(768)
    index.add(vectors)
    raw = tmp_path / "e5_Flat.index"
    faiss.write_index(index, str(raw))
    import_faiss_index(
        raw, corpus, index_dir_for(_settings(root, encoder=E5), "dense", corpus), resolve_encoder(E5)[0]
    )
    return root


def test_copied_index_is_what_the_service_looks_for_and_loads_without_building(
    bucket: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "replica"
    done = copy_index(_settings(bucket), "bm25", bucket, dest, progress=False)
    assert done.copied_bytes > 0 and done.skipped_bytes == 0
    assert (dest / corpus_relpath("wiki18-100k")).read_bytes() == TINY_CORPUS.read_bytes()
    assert load_manifest(done.index_dir).fingerprint() == done.manifest.fingerprint()
    # the replica's service finds it where it looks, verifies it, and builds nothing (build_if_missing off)
    found = ensure_index(_settings(dest, build_if_missing=False), "bm25")
    assert found == done.index_dir
    again = copy_index(_settings(bucket), "bm25", bucket, dest, progress=False)  # setup re-runs on restart
    assert again.copied_bytes == 0 and again.skipped_bytes == done.copied_bytes


def test_dense_copy_checks_the_encoder_and_leaves_tuning_caches_behind(bucket: Path, tmp_path: Path) -> None:
    src_dir = index_dir_for(_settings(bucket, encoder=E5), "dense")
    (src_dir / "encoders" / "abc").mkdir(parents=True)
    (src_dir / "encoders" / "abc" / "tuning-x.json").write_text(
        "{}"
    )  # machine-specific: not for other replicas
    done = copy_index(_settings(bucket, encoder=E5), "dense", bucket, tmp_path / "replica", progress=False)
    assert sorted(p.name for p in done.index_dir.iterdir()) == ["index.faiss", "manifest.json", "offsets.npy"]
    assert done.manifest.encoder is not None and done.manifest.encoder["name"] == E5
    with pytest.raises(
        IndexLoadError, match=r"no dense index for wiki18-100k at .*dense-bundled-minilm-Flat"
    ):
        copy_index(_settings(bucket), "dense", bucket, tmp_path / "other", progress=False)


def test_nothing_mounted_or_nothing_published_is_one_line(bucket: Path, tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError, match=r"is not a directory: is the index bucket mounted there\?"):
        copy_index(_settings(bucket), "bm25", tmp_path / "not-mounted", tmp_path / "replica")
    empty = tmp_path / "empty-bucket"
    empty.mkdir()
    with pytest.raises(IndexLoadError, match=r"no wiki18-100k corpus at .*sky/index-build.yaml"):
        copy_index(_settings(bucket), "bm25", empty, tmp_path / "replica")


def test_a_pinned_fingerprint_refuses_another_build(bucket: Path, tmp_path: Path) -> None:
    fingerprint = load_manifest(index_dir_for(_settings(bucket), "bm25")).fingerprint()
    with pytest.raises(
        IndexLoadError, match=r"not the pinned 0000000000000000 \(SEARCHRL_INDEX_FINGERPRINT\)"
    ):
        copy_index(_settings(bucket), "bm25", bucket, tmp_path / "a", fingerprints=["0000000000000000"])
    assert not (tmp_path / "a").exists()  # refused before writing anything
    done = copy_index(_settings(bucket), "bm25", bucket, tmp_path / "b", fingerprints=["x", fingerprint])
    assert done.manifest.fingerprint() == fingerprint


def test_a_corpus_changed_on_the_bucket_is_refused(bucket: Path, tmp_path: Path) -> None:
    corpus = bucket / corpus_relpath("wiki18-100k")
    index_dir = index_dir_for(_settings(bucket), "bm25")
    corpus.write_bytes(
        corpus.read_bytes().replace(b"a", b"e", 1)
    )  # the index directory is keyed by the old one
    with pytest.raises(IndexLoadError, match="no bm25 index for wiki18-100k"):
        copy_index(_settings(bucket), "bm25", bucket, tmp_path / "replica")
    # even under the old key (a renamed directory), the manifest's checksum catches it
    moved = index_dir_for(_settings(bucket), "bm25")
    moved.parent.mkdir(parents=True)
    shutil.copytree(index_dir, moved)
    with pytest.raises(IndexLoadError, match="corpus checksum differs"):
        copy_index(_settings(bucket), "bm25", bucket, tmp_path / "replica")


def test_a_truncated_copy_is_redone_and_a_missing_manifest_is_no_index(bucket: Path, tmp_path: Path) -> None:
    dest = tmp_path / "replica"
    done = copy_index(_settings(bucket), "bm25", bucket, dest, progress=False)
    offsets = done.index_dir / "offsets.npy"
    offsets.write_bytes(offsets.read_bytes()[:-8])  # an interrupted earlier copy
    (done.index_dir / MANIFEST).unlink()
    with pytest.raises(IndexLoadError, match="no bm25 index"):
        ensure_index(_settings(dest, build_if_missing=False), "bm25")  # never served half-copied
    again = copy_index(_settings(bucket), "bm25", bucket, dest, progress=False)
    assert again.copied_bytes == offsets.stat().st_size + (done.index_dir / MANIFEST).stat().st_size
    assert ensure_index(_settings(dest, build_if_missing=False), "bm25") == done.index_dir


def test_cli_prints_dir_fingerprint_summary_and_fails_in_one_line(bucket: Path, tmp_path: Path) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "searchrl", "index", "copy", *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    common = ["--corpus", "wiki18-100k", "--to", str(tmp_path / "replica")]
    ok = cli("--from", str(bucket), "--backend", "bm25", *common)
    assert ok.returncode == 0, ok.stderr[-1500:]
    index_dir, fingerprint, summary = ok.stdout.strip().split("\t")
    assert Path(index_dir).is_dir() and len(fingerprint) == 16 and summary.startswith("bm25: 20 passages")
    bad = cli("--from", str(tmp_path / "nowhere"), "--backend", "bm25", *common)
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: index source ") and "is the index bucket mounted there?" in line
    web = cli("--from", str(bucket), "--backend", "serper", *common)
    assert web.returncode == 0 and web.stdout == ""  # web backends have nothing to copy


def test_a_destination_that_cannot_be_written_is_one_line(bucket: Path, tmp_path: Path) -> None:
    dest = tmp_path / "replica"
    dest.mkdir()
    (dest / "corpora").write_text("a file where the corpora folder goes")
    with pytest.raises(
        IndexLoadError, match=r"cannot copy .* to .*wiki-18-100k.jsonl: .*; fix it and run again"
    ):
        copy_index(_settings(bucket), "bm25", bucket, dest, progress=False)
