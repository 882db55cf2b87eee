"""Hub downloads, served from local files: the right repo/file/type is requested, and the result is usable."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from searchrl.cli import main
from searchrl.errors import CorpusError, IndexLoadError
from searchrl.retrieval.corpus import iter_passages
from searchrl.retrieval.index import download as dl
from searchrl.retrieval.index import prebuilt
from searchrl.retrieval.index.build import FAISS_FILE, index_dir_for, load_manifest, verify_manifest
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS

faiss = pytest.importorskip("faiss")
huggingface_hub = pytest.importorskip("huggingface_hub")


class FakeHub:
    """Stands in for `huggingface_hub.hf_hub_download`, serving files from a local folder per repo."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, str, str | None]] = []

    def add(self, repo_id: str, filename: str, data: bytes) -> None:
        path = self.root / repo_id / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def __call__(
        self,
        repo_id: str,
        filename: str,
        *,
        repo_type: str | None = None,
        local_dir: str | Path | None = None,
        **_: object,
    ) -> str:
        self.calls.append((repo_id, filename, repo_type))
        src = self.root / repo_id / filename
        if repo_type != "dataset" or not src.is_file():
            raise huggingface_hub.errors.EntryNotFoundError(
                f"404 Client Error: {repo_id}/{filename} not found"
            )
        assert local_dir is not None
        dest = Path(local_dir) / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
        return str(dest)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    return fake


def _faiss_bytes(n: int, dim: int) -> bytes:
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(vecs)
    return faiss.serialize_index(index).tobytes()


def test_download_wiki18_100k_corpus(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("maknee/wiki-18-subsets", "wiki-18-100k.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    data = tmp_path / "data"
    path = dl.download_corpus("wiki18-100k", data)
    assert hub.calls == [("maknee/wiki-18-subsets", "wiki-18-100k.jsonl.gz", "dataset")]
    assert path == data / "corpora" / "wiki-18-100k.jsonl"
    assert path.read_bytes() == TINY_CORPUS.read_bytes()
    assert dl.download_corpus("wiki18-100k", data) == path
    assert len(hub.calls) == 1, "second call must reuse the decompressed corpus"


def test_download_full_wiki18_corpus(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    path = prebuilt.download("wiki18", RetrievalSettings(data_dir=tmp_path))
    assert hub.calls == [("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "dataset")]
    assert [p.id for p in iter_passages(path)] == [str(i) for i in range(20)]


def test_download_wiki18_100k_prebuilt_index(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("maknee/wiki-18-subsets", "wiki-18-100k.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    hub.add("maknee/wiki-18-subsets", "e5_Flat-100k.index", _faiss_bytes(20, 768))
    settings = RetrievalSettings(data_dir=tmp_path)
    index_dir = prebuilt.download("wiki18-100k", settings)
    assert ("maknee/wiki-18-subsets", "e5_Flat-100k.index", "dataset") in hub.calls
    # The service configured for this corpus + E5 finds it at its default location, and it verifies.
    served = settings.model_copy(update={"corpus": "wiki18-100k", "encoder": "intfloat/e5-base-v2"})
    assert index_dir == index_dir_for(served, "dense")
    m = load_manifest(index_dir)
    assert (m.kind, m.count, m.dim, m.index_type, m.source) == ("dense", 20, 768, "Flat", "prebuilt")
    assert m.encoder is not None
    assert (
        m.encoder["name"],
        m.encoder["pooling"],
        m.encoder["query_prefix"],
        m.encoder["passage_prefix"],
    ) == (
        "intfloat/e5-base-v2",
        "mean",
        "query: ",
        "passage: ",
    )
    from searchrl.retrieval.encoders.encoder import resolve_encoder

    verify_manifest(
        m,
        index_dir,
        kind="dense",
        corpus_path=tmp_path / "corpora" / "wiki-18-100k.jsonl",
        encoder=resolve_encoder("intfloat/e5-base-v2")[0],
        count=20,
    )
    assert faiss.read_index(str(index_dir / FAISS_FILE)).ntotal == 20


def test_download_split_e5_index_is_joined_in_order(hub: FakeHub, tmp_path: Path) -> None:
    blob = _faiss_bytes(20, 16)
    hub.add("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    hub.add("PeterJinGo/wiki-18-e5-index", "part_aa", blob[:1000])
    hub.add("PeterJinGo/wiki-18-e5-index", "part_ab", blob[1000:])
    index_dir = prebuilt.download("wiki18-e5-index", RetrievalSettings(data_dir=tmp_path))
    assert hub.calls == [
        ("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "dataset"),
        ("PeterJinGo/wiki-18-e5-index", "part_aa", "dataset"),
        ("PeterJinGo/wiki-18-e5-index", "part_ab", "dataset"),
    ]
    assert (index_dir / FAISS_FILE).read_bytes() == blob
    assert load_manifest(index_dir).dim == 16
    assert not (tmp_path / "downloads" / "wiki18-e5-index" / "part_aa").exists()


def test_prebuilt_index_for_another_corpus_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("maknee/wiki-18-subsets", "wiki-18-100k.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    hub.add("maknee/wiki-18-subsets", "e5_Flat-100k.index", _faiss_bytes(19, 768))
    with pytest.raises(IndexLoadError, match="holds 19 vectors but .* has 20 passages"):
        prebuilt.download("wiki18-100k", RetrievalSettings(data_dir=tmp_path))


def test_hub_errors_are_one_line(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(CorpusError) as exc:
        dl.download_corpus("wiki18", tmp_path)
    assert "cannot download wiki-18.jsonl.gz from dataset PeterJinGo/wiki-18-corpus" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_cli_download(hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.add("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", gzip.compress(TINY_CORPUS.read_bytes()))
    assert main(["index", "download", "wiki18", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "corpora" / "wiki-18.jsonl")
    assert main(["index", "download", "wiki18-e5-index", "--data-dir", str(tmp_path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: cannot download part_aa from dataset PeterJinGo/wiki-18-e5-index")


def test_download_module_does_not_import_indexing() -> None:
    """download <-> indexing was an import cycle: indexing fetches named corpora through download, so download
    must not reach back (turning a FAISS file into an index directory lives in retrieval/index/prebuilt.py)."""
    import ast

    tree = ast.parse(Path(dl.__file__).read_text(encoding="utf-8"))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {
        m
        for m in imported
        if m.startswith(("searchrl.retrieval.index.build", "searchrl.retrieval.index.prebuilt"))
    }
