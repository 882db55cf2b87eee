"""`searchrl index convert`: a Flat index into IVF/SQ8 in chunks, resumable, with recall measured (issue 48).

Two fixtures: synthetic clustered vectors in a real FAISS Flat file (the library, byte for byte against a direct
build), and a 400-passage slice of the bundled corpus with a real MiniLM Flat index (the CLI, a SIGKILL mid-way,
the service serving the result and answering the dev questions).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchrl.cli import main
from searchrl.retrieval.index.build import FAISS_FILE, MANIFEST, OFFSETS, index_dir_for, load_manifest
from searchrl.retrieval.index.convert import STOP_ENV, convert_flat, recall_at_k, work_dir_for
from searchrl.retrieval.index.convert_plan import FlatFile, make_plan, train_rows
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import DEV_QA, REPO

faiss = pytest.importorskip("faiss")

SLICE = 400  # passages of the bundled corpus in the CLI fixture: IVF8 gets 50 training points per list
TARGET = "IVF8,SQ8"
MAX_TOKENS = (
    48  # passages truncated to this for the fixture: encoding 400 whole ones took ~40 s on 2 busy cores
)


def _clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Unit vectors around 40 centres: the structure IVF exploits (uniform noise would make recall meaningless)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(40, dim))
    x = centres[rng.integers(0, 40, size=n)] + 0.35 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _write_flat(x: np.ndarray, path: Path) -> Path:
    index = faiss.index_factory(x.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(x)
    faiss.write_index(index, str(path))
    return path


# --- the library, on synthetic vectors -----------------------------------------------------------------------------


def test_flat_file_reads_rows_as_faiss_wrote_them(tmp_path: Path) -> None:
    x = _clustered(500, 24)
    flat = FlatFile.open(_write_flat(x, tmp_path / "flat.index"))
    assert (flat.dim, flat.count, flat.metric) == (24, 500, "inner_product")
    assert np.array_equal(flat.read(0, 500), x)
    assert np.array_equal(flat.read(123, 130), x[123:130])
    ids = np.array([0, 7, 8, 499])
    assert np.array_equal(flat.rows(ids), x[ids])
    l2 = faiss.IndexFlatL2(24)
    l2.add(x[:10])
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    assert FlatFile.open(tmp_path / "l2.index").metric == "l2"
    (tmp_path / "cut.index").write_bytes((tmp_path / "flat.index").read_bytes()[:-4])
    with pytest.raises(Exception, match="truncated or damaged"):
        FlatFile.open(tmp_path / "cut.index")


@pytest.mark.parametrize("index_type", ["IVF32,SQ8", "SQ8", "IVF32,Flat"])
def test_chunked_conversion_equals_a_direct_build(tmp_path: Path, index_type: str) -> None:
    """Train on the same sampled rows, add everything at once: the converted index has the same bytes."""
    x = _clustered(3_000, 32)
    xq = _clustered(60, 32, seed=9)
    flat = FlatFile.open(_write_flat(x, tmp_path / "flat.index"))
    plan, empty = make_plan(flat, index_type, train_sample=1_500, chunk=700)
    assert plan.chunks == 5 and plan.train_sample == 1_500
    result = convert_flat(
        flat, tmp_path / "work", plan, empty, lambda: (xq, "synthetic"), nprobe=8, progress=False
    )

    direct = faiss.index_factory(32, index_type, faiss.METRIC_INNER_PRODUCT)
    direct.train(x[train_rows(len(x), 1_500)])
    direct.add(x)
    if "IVF" in index_type:
        direct.nprobe = 8  # part of the file's header: the conversion measured recall at nprobe 8
    assert np.array_equal(faiss.serialize_index(result.index), faiss.serialize_index(direct))
    # recall is against exact search over every vector, at the nprobe asked for
    _, truth = faiss.knn(xq, x, 3, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = direct.search(xq, 3)
    assert result.recall == pytest.approx(recall_at_k(found, truth, 3))
    assert 0.5 < result.recall <= 1.0
    assert result.nprobe == (8 if "IVF" in index_type else None) and result.queries == 60


def test_plan_for_wiki18_matches_the_documented_arithmetic(tmp_path: Path) -> None:
    """Search-R1's file size (a sparse stand-in): 64.5 GB read, IVF16384,SQ8 ~16.4 GB written, 1,048,576 to train."""
    n, d = 21_015_324, 768
    small = _write_flat(np.zeros((1, d), dtype=np.float32), tmp_path / "one.index").read_bytes()
    header = bytearray(small[:45])
    header[8:16] = n.to_bytes(8, "little")
    header[37:45] = (n * d).to_bytes(8, "little")
    path = tmp_path / "e5_Flat.index"
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(45 + n * d * 4)  # sparse: no disk used
    flat = FlatFile.open(path)
    assert (flat.count, flat.dim) == (n, d)
    plan, _ = make_plan(flat, "IVF16384,SQ8", chunk=262_144, threads=16)
    assert plan.train_sample == 64 * 16_384
    assert plan.code_bytes == 768 + 8  # SQ8: one byte per dim, plus the id in the IVF list
    assert 16.3e9 < plan.index_bytes < 16.5e9
    assert plan.chunks == 81
    assert 20e9 < plan.memory_bytes < 24e9  # the merge phase: the whole result in memory, plus 30% slack
    assert plan.memory_bytes == max(plan.phases.values())
    text = "\n".join(plan.lines())
    assert "64.6 GB, read once" in text and "16.4" in text


def test_graph_index_types_are_refused_in_one_line(tmp_path: Path) -> None:
    flat = FlatFile.open(_write_flat(_clustered(100, 16), tmp_path / "flat.index"))
    with pytest.raises(Exception, match="cannot be converted in chunks") as exc:
        make_plan(flat, "HNSW32")
    assert "\n" not in str(exc.value)


# --- the CLI, on a slice of the bundled corpus with a real MiniLM Flat index --------------------------------------------


@pytest.fixture(scope="module")
def flat_slice(tmp_path_factory: pytest.TempPathFactory) -> RetrievalSettings:
    """400 bundled passages (every dev question's supporting titles first) and their MiniLM Flat index."""
    from searchrl.retrieval.index.build import ensure_index
    from searchrl.retrieval.index.bundled import ensure_bundled_corpus

    root = tmp_path_factory.mktemp("convert")
    rows = [json.loads(line) for line in ensure_bundled_corpus(root / "bundled").read_text().splitlines()]
    wanted = {
        t
        for line in DEV_QA.read_text().splitlines()
        if line.strip()
        for t in json.loads(line)["supporting_titles"]
    }
    first = [r for r in rows if r["contents"].split("\n", 1)[0].strip('"') in wanted]
    rest = [r for r in rows if r not in first][: SLICE - len(first)]
    corpus = root / "slice.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in first + rest), encoding="utf-8")
    settings = RetrievalSettings(
        backend="dense",
        corpus=str(corpus),
        data_dir=root / "data",
        autotune=False,
        encoder_max_length=MAX_TOKENS,
    )
    ensure_index(settings, "dense")
    return settings


def _convert_args(settings: RetrievalSettings, *extra: str) -> list[str]:
    return [
        "index", "convert", "--corpus", settings.corpus, "--data-dir", str(settings.data_dir),
        "--index-type", TARGET, "--chunk", "100", "--queries", "120", "--nprobe", "4", *extra,
    ]  # fmt: skip


def _flat_dir(settings: RetrievalSettings) -> Path:
    return index_dir_for(settings.model_copy(update={"index_type": "Flat"}), "dense")


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_memory_cap_below_the_plan_refuses_before_starting(
    flat_slice: RetrievalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    target = index_dir_for(flat_slice.model_copy(update={"index_type": TARGET}), "dense")
    assert main(_convert_args(flat_slice, "--memory-gb", "0.5")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # the lines above are the plan, logged
    assert err.startswith("error: convert to IVF8,SQ8 needs ~") and "--memory-gb allows 0.5 GB" in err
    assert not target.exists() and not work_dir_for(target).exists()  # nothing read, nothing written


def test_plan_flag_prints_memory_and_disk(
    flat_slice: RetrievalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_convert_args(flat_slice, "--plan")) == 0
    out = capsys.readouterr().out
    assert "needs memory ~" in out and "disk ~" in out and "4 chunks of 100" in out


def test_recall_below_the_threshold_exits_2_and_installs_nothing(
    flat_slice: RetrievalSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(_flat_dir(flat_slice))
    out = tmp_path / "low"
    assert (
        main(_convert_args(flat_slice, "--index-dir", str(out), "--nprobe", "1", "--min-recall", "0.999"))
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: recall@3 of IVF8,SQ8 is 0.") and "nothing installed" in err
    assert not out.exists() and work_dir_for(out).is_dir()  # the work is kept: a rerun only measures
    assert _snapshot(_flat_dir(flat_slice)) == before
    # the rerun with more lists probed resumes every chunk and installs
    assert (
        main(_convert_args(flat_slice, "--index-dir", str(out), "--nprobe", "8", "--min-recall", "0.5")) == 0
    )
    assert load_manifest(out).recall["nprobe"] == 8  # type: ignore[index]
    assert not work_dir_for(out).exists()


def test_a_killed_conversion_resumes_to_the_same_index(flat_slice: RetrievalSettings, tmp_path: Path) -> None:
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(_convert_args(flat_slice, "--index-dir", str(whole))) == 0

    cmd = [sys.executable, "-m", "searchrl", *_convert_args(flat_slice, "--index-dir", str(resumed))]
    env = {**os.environ, STOP_ENV: "2"}
    killed = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL after its 2nd new chunk: no cleanup ran
    work = work_dir_for(resumed)
    assert sorted(p.name for p in work.glob("shard-*.faiss")) == ["shard-00000.faiss", "shard-00001.faiss"]
    assert not resumed.exists()

    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed: 2 of 4 chunks were already done" in again.stderr
    assert (
        "loaded encoder" in killed.stderr and "loaded encoder" not in again.stderr
    )  # questions: from the work dir
    assert (resumed / FAISS_FILE).read_bytes() == (whole / FAISS_FILE).read_bytes()
    assert load_manifest(resumed).recall == load_manifest(whole).recall
    assert not work.exists()


def test_bare_flat_file_converts_like_its_folder(flat_slice: RetrievalSettings, tmp_path: Path) -> None:
    """Search-R1's shape: a bare e5_Flat.index plus the corpus; offsets are built from the corpus."""
    bare = shutil.copyfile(_flat_dir(flat_slice) / FAISS_FILE, tmp_path / "e5_Flat.index")
    a, b = tmp_path / "from-folder", tmp_path / "from-file"
    assert main(_convert_args(flat_slice, "--index-dir", str(a))) == 0
    assert main(_convert_args(flat_slice, "--index-dir", str(b), "--from", str(bare))) == 0
    assert (a / FAISS_FILE).read_bytes() == (b / FAISS_FILE).read_bytes()
    assert np.array_equal(np.load(a / OFFSETS), np.load(b / OFFSETS))
    ma, mb = load_manifest(a), load_manifest(b)
    assert ma.source == mb.source == "converted" and ma.index_type == TARGET
    assert (
        mb.converted_from
        and mb.converted_from["path"] == str(bare)
        and "fingerprint" not in mb.converted_from
    )
    assert (
        ma.converted_from
        and ma.converted_from["fingerprint"] == load_manifest(_flat_dir(flat_slice)).fingerprint()
    )


def test_the_service_serves_a_converted_index(flat_slice: RetrievalSettings) -> None:
    """The default index dir for IVF8,SQ8, loaded by the dense backend unchanged; GET / shows the recall; the dev
    questions find their supporting titles about as often as on Flat."""
    from fastapi.testclient import TestClient

    from searchrl.retrieval.serving.app import create_app

    assert main(_convert_args(flat_slice, "--nprobe", "4")) == 0
    ivf = flat_slice.model_copy(update={"index_type": TARGET, "nprobe": 4, "build_if_missing": False})
    questions = [json.loads(line) for line in DEV_QA.read_text().splitlines() if line.strip()]

    def title_recall(settings: RetrievalSettings) -> tuple[float, dict[str, Any]]:
        with TestClient(create_app(settings)) as client:
            info = client.get("/").json()
            body = {"queries": [q["question"] for q in questions], "topk": 3, "return_scores": True}
            started = time.perf_counter()
            result = client.post("/retrieve", json=body).json()["result"]
            assert time.perf_counter() - started < 30
        found = []
        for q, hits in zip(questions, result, strict=True):
            titles = {h["document"]["contents"].split("\n", 1)[0].strip('"') for h in hits}
            found.append(len(titles & set(q["supporting_titles"])) / len(q["supporting_titles"]))
        return float(np.mean(found)), info

    converted, info = title_recall(ivf)
    flat, flat_info = title_recall(flat_slice)
    assert info["index_type"] == TARGET and info["corpus_size"] == SLICE
    assert info["index_recall"]["recall@3"] >= 0.9 and info["index_recall"]["nprobe"] == 4
    assert flat_info["index_recall"] is None
    assert converted >= flat - 0.05 and converted > 0.7, (converted, flat)
    assert (index_dir_for(ivf, "dense") / MANIFEST).is_file()
