"""Index directories: building (dense + BM25), manifests, locating, reuse, and one-line mismatch errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from searchrl import __version__
from searchrl.errors import ConfigError, IndexLoadError
from searchrl.retrieval.corpus import corpus_checksum
from searchrl.retrieval.encoders.encoder import Encoder, resolve_encoder
from searchrl.retrieval.index import build
from searchrl.retrieval.index.build import (
    FAISS_FILE,
    OFFSETS,
    build_bm25_index,
    build_dense_index,
    default_index_dir,
    ensure_index,
    load_manifest,
    resolve_corpus,
    verify_manifest,
)
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS

faiss = pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory: pytest.TempPathFactory, minilm: Encoder) -> Path:
    out = tmp_path_factory.mktemp("idx") / "dense"
    build_dense_index(TINY_CORPUS, out, minilm, index_type="Flat", batch_size=8)
    return out


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_bm25_index(TINY_CORPUS, out)
    return out


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_dense_manifest_describes_the_index(dense_dir: Path) -> None:
    m = load_manifest(dense_dir)
    assert m.kind == "dense" and m.count == 20 and m.dim == 384
    assert m.encoder == {
        "name": "bundled-minilm",
        "pooling": "mean",
        "query_prefix": "",
        "passage_prefix": "",
        "dim": 384,
        "normalize": True,
        "precision": "fp32",
    }
    assert (m.index_type, m.metric, m.source) == ("Flat", "inner_product", "built")
    assert m.corpus_checksum == corpus_checksum(TINY_CORPUS)
    assert m.corpus_path == str(TINY_CORPUS.resolve())
    assert m.build_seconds > 0 and m.created_at.endswith("+00:00") and m.searchrl_version == __version__
    raw = json.loads((dense_dir / "manifest.json").read_text())
    assert raw["kind"] == "dense" and raw["encoder"]["name"] == "bundled-minilm"
    index = faiss.read_index(str(dense_dir / FAISS_FILE))
    assert index.ntotal == 20 and index.d == 384 and index.metric_type == faiss.METRIC_INNER_PRODUCT
    assert not list(dense_dir.parent.glob(".dense*")), "staging directory left behind"


def test_dense_index_finds_the_passage(dense_dir: Path, minilm: Encoder) -> None:
    index = faiss.read_index(str(dense_dir / FAISS_FILE))
    scores, rows = index.search(minilm.encode_queries(["Who directed The Seventh Seal?"]), 3)
    assert rows[0][0] == 0  # row 0 of the tiny corpus is "The Seventh Seal"
    assert scores[0][0] > scores[0][1]


def test_bm25_manifest(bm25_dir: Path) -> None:
    m = load_manifest(bm25_dir)
    assert (m.kind, m.count, m.encoder, m.dim) == ("bm25", 20, None, None)
    assert m.tokenizer == {"stemmer": "english", "stopwords": "en", "lower": True}
    assert m.bm25 is not None and m.bm25["k1"] > 0
    assert (bm25_dir / OFFSETS).is_file() and (bm25_dir / "bm25").is_dir()


def test_other_factory_strings_work(tmp_path: Path, minilm: Encoder) -> None:
    m = build_dense_index(TINY_CORPUS, tmp_path / "hnsw", minilm, index_type="HNSW8")
    assert m.index_type == "HNSW8"
    index = faiss.read_index(str(tmp_path / "hnsw" / FAISS_FILE))
    assert index.ntotal == 20
    with pytest.raises(ConfigError, match="not a valid FAISS factory string"):
        build_dense_index(TINY_CORPUS, tmp_path / "bad", minilm, index_type="NoSuchIndex")
    assert not (tmp_path / "bad").exists()


def test_untrained_index_types_train_on_the_corpus(
    tmp_path: Path, minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "TRAIN_SAMPLE", 8)  # train after 8 vectors... here after the only chunk
    m = build_dense_index(TINY_CORPUS, tmp_path / "sq", minilm, index_type="SQ8")
    assert m.count == 20 and faiss.read_index(str(tmp_path / "sq" / FAISS_FILE)).ntotal == 20


# --- verify_manifest: one line naming the mismatch --------------------------------------------------------


def test_verify_accepts_the_matching_corpus_and_encoder(dense_dir: Path, minilm: Encoder) -> None:
    verify_manifest(
        load_manifest(dense_dir),
        dense_dir,
        kind="dense",
        corpus_path=TINY_CORPUS,
        encoder=minilm.spec,
        count=20,
    )


def test_verify_rejects_another_corpus(dense_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_bytes(TINY_CORPUS.read_bytes().replace(b"1957", b"1958", 1))
    with pytest.raises(IndexLoadError) as exc:
        verify_manifest(load_manifest(dense_dir), dense_dir, kind="dense", corpus_path=other)
    assert _one_line(exc).startswith("corpus checksum differs:")
    assert str(other) in str(exc.value)


def test_verify_rejects_another_encoder(dense_dir: Path) -> None:
    e5 = resolve_encoder("intfloat/e5-base-v2")[0]
    with pytest.raises(IndexLoadError) as exc:
        verify_manifest(load_manifest(dense_dir), dense_dir, kind="dense", encoder=e5)
    message = _one_line(exc)
    assert message.startswith("encoder differs:")
    assert "'bundled-minilm'" in message and "'intfloat/e5-base-v2'" in message


def test_verify_rejects_wrong_count_kind_and_missing_files(dense_dir: Path, tmp_path: Path) -> None:
    m = load_manifest(dense_dir)
    with pytest.raises(IndexLoadError) as exc:
        verify_manifest(m, dense_dir, kind="dense", count=19)
    assert _one_line(exc).startswith("count differs: manifest says 20 passages, index holds 19")
    with pytest.raises(IndexLoadError) as exc:
        verify_manifest(m, dense_dir, kind="bm25")
    assert "is a dense index" in _one_line(exc)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text((dense_dir / "manifest.json").read_text())
    with pytest.raises(IndexLoadError) as exc:
        verify_manifest(m, broken, kind="dense")
    assert "incomplete (missing offsets.npy, index.faiss)" in _one_line(exc)


def test_load_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError) as exc:
        load_manifest(tmp_path)
    assert "manifest.json missing" in _one_line(exc)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(IndexLoadError) as exc:
        load_manifest(tmp_path)
    assert "not an index manifest" in _one_line(exc)


# --- locating corpora and index directories ----------------------------------------------------------------


def test_resolve_corpus_variants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = RetrievalSettings(data_dir=tmp_path, corpus=str(TINY_CORPUS))
    assert resolve_corpus(s) == TINY_CORPUS
    gz = tmp_path / "mine.jsonl.gz"
    gz.write_bytes(gzip.compress(TINY_CORPUS.read_bytes()))
    plain = resolve_corpus(s.model_copy(update={"corpus": str(gz)}))
    assert plain == tmp_path / "corpora" / "mine.jsonl"
    assert plain.read_bytes() == TINY_CORPUS.read_bytes()
    bundled = resolve_corpus(s.model_copy(update={"corpus": "bundled"}))
    assert bundled == tmp_path / "corpora" / "wiki-bundled-en.jsonl"
    calls = []
    monkeypatch.setattr(
        "searchrl.retrieval.index.download.download_corpus",
        lambda name, d: calls.append((name, d)) or TINY_CORPUS,
    )
    assert resolve_corpus(s.model_copy(update={"corpus": "wiki18-100k"})) == TINY_CORPUS
    assert calls == [("wiki18-100k", tmp_path)]
    with pytest.raises(ConfigError, match="is not a file"):
        resolve_corpus(s.model_copy(update={"corpus": str(tmp_path / "nope.jsonl")}))


def test_default_index_dir_layout(tmp_path: Path) -> None:
    s = RetrievalSettings(
        data_dir=tmp_path, corpus=str(TINY_CORPUS), encoder="intfloat/e5-base-v2", index_type="IVF16,SQ8"
    )
    checksum = corpus_checksum(TINY_CORPUS).split(":")[1]
    base = tmp_path / "indexes" / f"tiny_corpus-{checksum[:10]}"
    assert default_index_dir(s, "dense") == base / "dense-e5-base-v2-IVF16_SQ8"
    assert default_index_dir(s, "bm25") == base / "bm25"


def test_ensure_index_builds_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = RetrievalSettings(backend="bm25", data_dir=tmp_path, corpus=str(TINY_CORPUS))
    first = ensure_index(s, "bm25")
    assert load_manifest(first).count == 20

    def no_rebuild(*a: object, **k: object) -> None:
        raise AssertionError("index rebuilt although a matching one exists")

    monkeypatch.setattr(build, "build_bm25_index", no_rebuild)
    assert ensure_index(s, "bm25") == first
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_index(s, "bm25", force=True)


def test_ensure_index_without_build_if_missing(tmp_path: Path) -> None:
    s = RetrievalSettings(data_dir=tmp_path, corpus=str(TINY_CORPUS), build_if_missing=False)
    with pytest.raises(IndexLoadError) as exc:
        ensure_index(s, "bm25")
    assert "build it with `searchrl index build --backend bm25`" in _one_line(exc)


def test_ensure_index_never_builds_dense_wiki18_implicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("searchrl.retrieval.index.download.download_corpus", lambda name, d: TINY_CORPUS)
    s = RetrievalSettings(data_dir=tmp_path, corpus="wiki18-100k", encoder="intfloat/e5-base-v2")
    with pytest.raises(IndexLoadError) as exc:
        ensure_index(s, "dense")
    assert "searchrl index download wiki18-100k" in _one_line(exc)


def test_explicit_index_dir_that_does_not_match(tmp_path: Path, dense_dir: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_bytes(TINY_CORPUS.read_bytes() + b'{"id": "20", "contents": "\\"X\\"\\nextra"}\n')
    s = RetrievalSettings(data_dir=tmp_path, corpus=str(other), index_dir=dense_dir)
    with pytest.raises(IndexLoadError) as exc:
        ensure_index(s, "dense")
    assert _one_line(exc).startswith("corpus checksum differs")


# --- `searchrl index build` ----------------------------------------------------------------------------------


def test_cli_build_bm25(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchrl.cli import main

    argv = ["index", "build", "--backend", "bm25", "--corpus", str(TINY_CORPUS), "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    index_dir, summary = out[0].split("\t")
    assert load_manifest(Path(index_dir)).count == 20
    assert summary.startswith("bm25: 20 passages")


def test_cli_build_passes_only_given_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchrl.cli import main

    calls: list[tuple[RetrievalSettings, str, bool]] = []

    def fake_ensure(settings: RetrievalSettings, kind: str, *, force: bool = False) -> Path:
        calls.append((settings, kind, force))
        return tmp_path

    monkeypatch.setattr(build, "ensure_index", fake_ensure)
    monkeypatch.setattr(
        build,
        "load_manifest",
        lambda d: build.IndexManifest(kind="dense", count=1, corpus_path="c", corpus_checksum="sha256:0"),
    )
    monkeypatch.setenv("SEARCHRL_RETRIEVAL_ENCODE_BATCH_SIZE", "32")
    argv = [
        "index",
        "build",
        "--backend",
        "all",
        "--encoder",
        "intfloat/e5-base-v2",
        "--index-type",
        "HNSW32",
        "--data-dir",
        str(tmp_path),
        "--force",
    ]
    assert main(argv) == 0
    assert [(k, f) for _, k, f in calls] == [("dense", True), ("bm25", True)]
    s = calls[0][0]
    assert (s.encoder, s.index_type, s.data_dir, s.encode_batch_size, s.corpus) == (
        "intfloat/e5-base-v2",
        "HNSW32",
        tmp_path,
        32,
        "bundled",  # env applies where no flag was given
    )
    assert main(["index", "build", "--backend", "all", "--index-dir", str(tmp_path)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("error: --index-dir names one directory: use it with --backend dense or --backend bm25")
    )


# --- an index type too big for the corpus (issue 27 item 7) ----------------------------------------------------


@pytest.mark.parametrize(
    ("index_type", "need"),
    [("Flat", 0), ("HNSW32", 0), ("IVF4096,SQ8", 4096), ("IVF16,PQ8", 256), ("IVF1024,PQ64x4", 1024)],
)
def test_min_training_points(index_type: str, need: int) -> None:
    assert build.min_training_points(index_type) == need


def test_too_small_corpus_is_one_line_before_the_encoder_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchrl.cli import main

    argv = ["index", "build", "--backend", "dense", "--corpus", str(TINY_CORPUS), "--data-dir", str(tmp_path)]
    assert main([*argv, "--index-type", "IVF4096,SQ8"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: index_type 'IVF4096,SQ8' needs at least 4096 passages to train, this corpus has 20; "
        "use Flat or HNSW32 for a corpus this small"
    )
    with pytest.raises(ConfigError, match="needs at least 256 passages"):
        build.check_trainable("IVF4,PQ8", 20)
    build.check_trainable("IVF4,SQ8", 20)  # 4 lists from 20 vectors trains (FAISS only warns)
