"""Start-up auto-tuning of the query encoder: candidates per CPU, the quality gate, the cached choice, GET /.

Real parts throughout: real (tiny, randomly initialised) BERTs exported to real ONNX Runtime sessions, a real
FAISS index over the tiny corpus, the real dense backend behind the real app.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from searchrl.errors import ConfigError
from searchrl.retrieval.encoders import tuning
from searchrl.retrieval.encoders.encoder import Encoder
from searchrl.retrieval.encoders.tuning import (
    candidate_names,
    has_fast_bf16,
    layouts,
    recall_at_k,
    tune,
)
from searchrl.retrieval.queries import sample_queries
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import DEV_QA, TINY_CORPUS
from tests.retrieval.conftest import write_tiny_bert

torch = pytest.importorskip("torch")
faiss = pytest.importorskip("faiss")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    """A 1-layer random BERT named like E5 (real weights cannot be downloaded here)."""
    folder = write_tiny_bert(tmp_path_factory.mktemp("models") / "e5-tiny")
    return Encoder.load(str(folder), device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def tiny_index(tiny_e5: Encoder) -> object:
    passages = [json.loads(line)["contents"] for line in TINY_CORPUS.read_text().splitlines()]
    index = faiss.IndexFlatIP(tiny_e5.dim)
    index.add(tiny_e5.encode_passages(passages))
    return index


def _settings(**kw: object) -> RetrievalSettings:
    base = {"autotune_seconds": 0.05, "gate_queries": 40, "batch_size": 16, "forward_batch_size": 16}
    return RetrievalSettings(backend="dense", corpus=str(TINY_CORPUS), **{**base, **kw})


def _queries() -> list[str]:
    return sample_queries(TINY_CORPUS, DEV_QA, limit=64)


def test_fast_bf16_is_read_from_cpu_flags() -> None:
    assert has_fast_bf16(["avx2", "avx512f", "avx512_bf16"])
    assert has_fast_bf16(["amx_bf16"]) and has_fast_bf16(["fp", "asimd", "bf16"])  # x86 AMX, Arm BF16
    assert not has_fast_bf16(["avx2", "fma", "avx512f", "avx512_vnni"])


def test_candidates_never_include_bf16_without_fast_bf16() -> None:
    auto = RetrievalSettings()
    assert candidate_names(auto, fast_bf16=True, onnx_ok=True) == [
        "torch-fp32",
        "torch-bf16",
        "onnx-fp32",
        "onnx-int8",
    ]
    assert candidate_names(auto, fast_bf16=False, onnx_ok=True) == ["torch-fp32", "onnx-fp32", "onnx-int8"]
    assert candidate_names(auto, fast_bf16=False, onnx_ok=False) == ["torch-fp32"]
    assert candidate_names(RetrievalSettings(precision="int8"), fast_bf16=True, onnx_ok=True) == ["onnx-int8"]
    with pytest.raises(ValueError, match="precision bf16 does not run on encoder_backend onnx"):
        RetrievalSettings(encoder_backend="onnx", precision="bf16")
    with pytest.raises(ConfigError, match="needs onnxruntime"):
        candidate_names(RetrievalSettings(encoder_backend="onnx"), fast_bf16=True, onnx_ok=False)


def test_layouts_use_every_core_once() -> None:
    assert layouts(1) == [(1, 1)]
    assert layouts(2) == [(1, 2), (2, 1)]
    assert layouts(16) == [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
    assert layouts(6) == [(1, 6), (2, 3), (6, 1)]


def test_recall_at_k_counts_overlap_not_order() -> None:
    ref = np.array([[1, 2, 3], [4, 5, 6]])
    assert recall_at_k(ref, np.array([[3, 2, 1], [4, 5, 6]])) == 1.0
    assert recall_at_k(ref, np.array([[1, 2, 9], [7, 8, 9]])) == pytest.approx((2 / 3 + 0) / 2)
    assert recall_at_k(np.array([[1, -1, -1]]), np.array([[1, 5, 6]])) == 1.0  # FAISS pads short results


def test_tune_measures_gates_and_caches(
    tiny_e5: Encoder, tiny_index: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuning, "has_fast_bf16", lambda flags: False)  # as on an AVX2-only CPU
    settings = _settings()
    pool, report = tune(settings, tiny_e5, tiny_index, tmp_path, "idx-1", _queries())
    try:
        names = [c["name"] for c in report.candidates]
        assert names == ["torch-fp32", "onnx-fp32", "onnx-int8"]  # no bf16 without fast bf16
        by_name = {c["name"]: c for c in report.candidates}
        assert by_name["torch-fp32"]["recall@3"] == 1.0
        assert by_name["onnx-fp32"]["recall@3"] >= 0.99 and by_name["onnx-fp32"]["status"] == "ok"
        chosen = report.choice["candidate"]
        assert by_name[chosen]["status"] == "ok"
        assert report.qps == max(row["qps"] for row in report.layouts) > 0
        assert {(r["workers"], r["threads"]) for r in report.layouts} <= set(layouts(report.machine["cores"]))
        # every candidate that passed the gate was timed in every layout, not only the 1 x N winner
        ok = {c["name"] for c in report.candidates if c["status"] == "ok"}
        assert {r["candidate"] for r in report.layouts} == ok
        assert (pool.workers, pool.threads) == (report.choice["workers"], report.choice["threads"])
        # the served pool gives the vectors of the chosen candidate: same top-3 as the reference
        q = _queries()[:8]
        assert (
            recall_at_k(
                tiny_index.search(tiny_e5.encode_queries(q), 3)[1],
                tiny_index.search(pool.encode_queries(q), 3)[1],
            )
            >= 0.9
        )  # type: ignore[attr-defined]
        # the gate result is recorded beside the exported model, per index fingerprint
        sidecar = json.loads(next(tmp_path.glob("encoders/*/onnx-fp32.json")).read_text())
        assert sidecar["gate"]["idx-1"]["queries"] == report.gate_queries == 40
    finally:
        pool.close()
    assert report.cache_path and Path(report.cache_path).is_file() and not report.cached

    # A restart on the same machine reads the choice: nothing is measured again.
    def no_measuring(*args: object, **kw: object) -> float:
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(tuning, "measure_qps", no_measuring)
    pool2, again = tune(settings, tiny_e5, tiny_index, tmp_path, "idx-1", _queries())
    pool2.close()
    assert again.cached and again.choice == report.choice and again.qps == report.qps
    # Another index (or other settings) is another question: measured afresh.
    with pytest.raises(AssertionError, match="must not be measured"):
        tune(settings, tiny_e5, tiny_index, tmp_path, "idx-2", _queries())


def test_gate_refuses_an_encoder_that_disagrees(
    tiny_e5: Encoder, tiny_index: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken int8 export (vectors unrelated to the fp32 ones) is refused with a one-line reason."""
    real_build = tuning._build
    rng = np.random.default_rng(0)

    def build(name: str, *args: object) -> Encoder:
        encoder = real_build(name, *args)  # type: ignore[arg-type]
        if name == "onnx-int8":

            def garbage(texts: list[str]) -> np.ndarray:
                v = rng.standard_normal((len(texts), encoder.dim)).astype(np.float32)
                return v / np.linalg.norm(v, axis=1, keepdims=True)

            encoder._forward = garbage  # type: ignore[method-assign]
        return encoder

    monkeypatch.setattr(tuning, "_build", build)
    pool, report = tune(_settings(), tiny_e5, tiny_index, tmp_path, "idx", _queries())
    pool.close()
    int8 = next(c for c in report.candidates if c["name"] == "onnx-int8")
    assert int8["status"].startswith("refused: recall@3 ") and "< 0.99 on 40 queries" in int8["status"]
    assert "\n" not in int8["status"] and int8["qps"] is None
    assert report.choice["candidate"] != "onnx-int8"
    # Asked for explicitly, the service refuses to start rather than serve it.
    with pytest.raises(ConfigError, match="no query encoder passed the quality gate .*onnx-int8 refused"):
        tune(_settings(precision="int8"), tiny_e5, tiny_index, tmp_path, "idx", _queries())


def test_autotune_off_serves_the_settings(tiny_e5: Encoder, tiny_index: object, tmp_path: Path) -> None:
    from searchrl.retrieval.encoders.tuning import serving_encoder

    settings = _settings(autotune=False, encoder_workers=2, threads=2)
    pool, report = serving_encoder(settings, tiny_e5, tiny_index, tmp_path, "idx", TINY_CORPUS)
    try:
        assert report is not None and report["choice"]["candidate"] == "torch-fp32"
        assert (pool.workers, pool.threads) == (2, 1) and len(report["layouts"]) == 1
        assert pool.describe()["encoder_backend"] == "torch"
    finally:
        pool.close()


@pytest.mark.slow
def test_get_root_reports_the_tuned_encoder(tmp_path: Path) -> None:
    """The real app with the bundled MiniLM: the choice and its measured q/s are in GET /."""
    from fastapi.testclient import TestClient

    from searchrl.retrieval.serving.app import create_app

    settings = RetrievalSettings(
        backend="dense", corpus=str(TINY_CORPUS), data_dir=tmp_path, autotune_seconds=0.05, gate_queries=40
    )
    with TestClient(create_app(settings)) as client:
        body = client.get("/").json()
        hits = client.post(
            "/retrieve", json={"queries": ["Who directed The Seventh Seal?"], "topk": 1}
        ).json()
    tuned = body["encoder_tuning"]
    assert body["encoder_backend"] == tuned["choice"]["candidate"].split("-")[0]
    assert body["precision"] == tuned["choice"]["candidate"].split("-")[1]
    assert body["encoder_workers"] == tuned["choice"]["workers"] and tuned["qps"] > 0
    assert {c["name"] for c in tuned["candidates"]} >= {"torch-fp32", "onnx-fp32", "onnx-int8"}
    assert "Seventh Seal" in hits["result"][0][0]["contents"]  # return_scores false: bare documents


def test_workers_share_weights_unless_they_need_their_own_thread_pool(
    tiny_e5: Encoder, tmp_path: Path
) -> None:
    from searchrl.retrieval.encoders.tuning import Choice, make_pool

    one_thread = make_pool(Choice("onnx-fp32", 2, 1, 16), tiny_e5, tmp_path, "fp")
    two_threads = make_pool(Choice("onnx-fp32", 2, 2, 16), tiny_e5, tmp_path, "fp")
    torch_pool = make_pool(Choice("torch-fp32", 2, 1, 16), tiny_e5, tmp_path, "fp")
    try:
        a, b = one_thread.encoders
        assert a.session is b.session and a.tokenizer is not b.tokenizer  # type: ignore[attr-defined]
        c, d = two_threads.encoders
        assert c.session is not d.session  # type: ignore[attr-defined]
        e, f = torch_pool.encoders
        assert e.model is f.model is tiny_e5.model and e.tokenizer is not f.tokenizer
        q = ["who wrote hamlet", "x", "capital of france"]
        np.testing.assert_allclose(one_thread.encode_queries(q), tiny_e5.encode_queries(q), atol=1e-5)
    finally:
        for pool in (one_thread, two_threads, torch_pool):
            pool.close()


def test_a_failed_export_falls_back_with_one_line(
    tiny_e5: Encoder, tiny_index: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index directory the service cannot write to (a read-only bucket mount): ONNX is refused, torch serves."""
    import searchrl.retrieval.encoders.export as export

    def read_only(*args: object, **kw: object) -> Path:
        raise PermissionError(13, "Permission denied", str(tmp_path / "encoders"))

    monkeypatch.setattr(export, "ensure_export", read_only)
    pool, report = tune(_settings(), tiny_e5, tiny_index, tmp_path, "idx", _queries())
    pool.close()
    refused = [c for c in report.candidates if c["name"].startswith("onnx")]
    assert refused and all(
        c["status"].startswith("refused: could not build (PermissionError") for c in refused
    )
    assert all("\n" not in c["status"] for c in refused)
    assert report.choice["candidate"].startswith("torch")


def test_cli_refuses_a_precision_the_backend_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchrl.cli import main

    monkeypatch.setenv("SEARCHRL_RETRIEVAL_ENCODER_BACKEND", "torch")
    monkeypatch.setenv("SEARCHRL_RETRIEVAL_PRECISION", "int8")
    assert main(["serve", "--backend", "dense"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "int8 is ONNX Runtime only" in err and "\n" not in err
