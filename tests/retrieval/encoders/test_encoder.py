"""Encoders: each family's prefixes and pooling, checked against a direct computation on real models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from searchrl.errors import ConfigError
from searchrl.retrieval.encoders.encoder import (
    BGE_QUERY_INSTRUCTION,
    Encoder,
    EncoderSpec,
    bundled_minilm_path,
    resolve_encoder,
)
from tests.conftest import TINY_CORPUS
from tests.retrieval.conftest import write_tiny_bert

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two randomly initialised 1-layer BERTs named like an E5 and a BGE model (weights cannot be downloaded
    here; the family conventions are picked by name, and the maths is checked against direct computation)."""
    root = tmp_path_factory.mktemp("models")
    for name in ("e5-tiny", "bge-tiny"):
        write_tiny_bert(root / name)
    return root


def _direct(folder: Path, texts: list[str], pooling: str) -> np.ndarray:
    """What the encoder should produce, computed one text at a time (no padding, no sorting)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
            vec = hidden[0] if pooling == "cls" else hidden.mean(dim=0)
            out.append(torch.nn.functional.normalize(vec, dim=0).numpy())
    return np.stack(out)


def test_spec_for_each_family() -> None:
    spec, ref = resolve_encoder("bundled-minilm")
    assert (spec.pooling, spec.query_prefix, spec.passage_prefix, spec.dim) == ("mean", "", "", 384)
    assert Path(ref) == bundled_minilm_path()
    e5, ref = resolve_encoder("intfloat/e5-base-v2")
    assert (e5.pooling, e5.query_prefix, e5.passage_prefix, ref) == (
        "mean",
        "query: ",
        "passage: ",
        "intfloat/e5-base-v2",
    )
    bge, _ = resolve_encoder("BAAI/bge-base-en-v1.5")
    assert (bge.pooling, bge.query_prefix, bge.passage_prefix) == ("cls", BGE_QUERY_INSTRUCTION, "")
    assert EncoderSpec.from_dict(e5.to_dict()) == e5


def test_unknown_encoder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown encoder 'someone/model'"):
        resolve_encoder("someone/model")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="has no modules.json"):
        resolve_encoder(str(tmp_path / "plain"))


def test_sentence_transformers_folder_config_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "st-model"
    folder.mkdir()
    src = bundled_minilm_path()
    shutil.copy(src / "config.json", folder / "config.json")
    shutil.copy(src / "modules.json", folder / "modules.json")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "q: ", "document": "d: "}})
    )
    spec, _ = resolve_encoder(str(folder))
    assert (spec.pooling, spec.query_prefix, spec.passage_prefix, spec.dim) == ("cls", "q: ", "d: ", 384)
    e5_snapshot = tmp_path / "e5-base-v2"  # an ST-format E5 snapshot without prompts keeps E5's prefixes
    shutil.copytree(folder, e5_snapshot)
    (e5_snapshot / "config_sentence_transformers.json").unlink()
    (e5_snapshot / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    spec, _ = resolve_encoder(str(e5_snapshot))
    assert (spec.pooling, spec.query_prefix, spec.passage_prefix) == ("mean", "query: ", "passage: ")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ConfigError, match="unsupported pooling"):
        resolve_encoder(str(folder))


def test_bundled_minilm_matches_sentence_transformers(minilm: Encoder) -> None:
    st = pytest.importorskip("sentence_transformers")
    texts = [json.loads(line)["contents"] for line in TINY_CORPUS.read_text().splitlines()[:8]]
    ours = minilm.encode_passages(texts, batch_size=3)
    reference = st.SentenceTransformer(str(bundled_minilm_path()), device="cpu").encode(
        texts, normalize_embeddings=True
    )
    assert ours.dtype == np.float32 and ours.shape == (8, 384)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_embeddings_are_normalised_and_in_input_order(minilm: Encoder) -> None:
    texts = ["a", "a much longer text about the Seventh Seal and Ingmar Bergman", "chess with Death", ""]
    batched = minilm.encode_queries(texts, batch_size=2)
    singles = np.concatenate([minilm.encode_queries([t]) for t in texts])
    np.testing.assert_allclose(batched, singles, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert minilm.encode_queries([]).shape == (0, 384)


@pytest.mark.parametrize(
    ("name", "pooling", "query_prefix", "passage_prefix"),
    [
        ("e5-tiny", "mean", "query: ", "passage: "),
        ("bge-tiny", "cls", BGE_QUERY_INSTRUCTION, ""),
    ],
)
def test_family_prefixes_and_pooling(
    tiny_models: Path, name: str, pooling: str, query_prefix: str, passage_prefix: str
) -> None:
    folder = tiny_models / name
    enc = Encoder.load(str(folder), device="cpu", precision="fp32")
    assert (enc.spec.pooling, enc.spec.query_prefix, enc.spec.passage_prefix, enc.dim) == (
        pooling,
        query_prefix,
        passage_prefix,
        32,
    )
    queries = ["who wrote hamlet", "capital of france and its largest museum"]
    np.testing.assert_allclose(
        enc.encode_queries(queries), _direct(folder, [query_prefix + q for q in queries], pooling), atol=1e-5
    )
    np.testing.assert_allclose(
        enc.encode_passages(queries),
        _direct(folder, [passage_prefix + q for q in queries], pooling),
        atol=1e-5,
    )


def test_bf16_on_cpu_is_close_to_fp32(tiny_models: Path) -> None:
    folder = str(tiny_models / "e5-tiny")
    fp32 = Encoder.load(folder, device="cpu", precision="fp32").encode_queries(["hello world"])
    bf16 = Encoder.load(folder, device="cpu", precision="bf16").encode_queries(["hello world"])
    assert bf16.dtype == np.float32
    assert float(fp32[0] @ bf16[0]) > 0.98


def test_precision_and_device_knobs_are_checked(tiny_models: Path) -> None:
    with pytest.raises(ConfigError, match="fp16 is for GPUs"):
        Encoder.load(str(tiny_models / "e5-tiny"), device="cpu", precision="fp16")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            Encoder.load(str(tiny_models / "e5-tiny"), device="cuda")


def test_missing_weights_are_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "e5-empty"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        Encoder.load(str(folder), device="cpu")
    assert "cannot load encoder" in str(info.value) and "\n" not in str(info.value)


# --- ONNX Runtime variants (issue 14) -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["e5-tiny", "bge-tiny"])
def test_onnx_export_matches_torch_and_is_cached(tiny_models: Path, tmp_path: Path, name: str) -> None:
    pytest.importorskip("onnxruntime")
    from searchrl.retrieval.encoders.export import (
        OnnxEncoder,
        ensure_export,
        read_sidecar,
        weights_fingerprint,
    )

    torch_enc = Encoder.load(str(tiny_models / name), device="cpu", precision="fp32")
    queries = ["who wrote hamlet", "capital of france and its largest museum", "x"]
    fp32_path = ensure_export(torch_enc, tmp_path, "onnx-fp32")
    fingerprint = weights_fingerprint(torch_enc)
    assert fp32_path == tmp_path / "encoders" / fingerprint / "onnx-fp32.onnx"
    meta = read_sidecar(fp32_path)
    assert (
        meta is not None
        and meta["weights_fingerprint"] == fingerprint
        and meta["encoder"]["name"] == str(tiny_models / name)
    )
    onnx_enc = OnnxEncoder.open(fp32_path, torch_enc, threads=1)
    assert (onnx_enc.backend, onnx_enc.precision, onnx_enc.dim) == ("onnx", "fp32", 32)
    # same prefixes and pooling as the torch path: vectors agree to float precision
    np.testing.assert_allclose(onnx_enc.encode_queries(queries), torch_enc.encode_queries(queries), atol=1e-5)
    int8 = OnnxEncoder.open(ensure_export(torch_enc, tmp_path, "onnx-int8"), torch_enc, threads=1)
    cos = (int8.encode_queries(queries) * torch_enc.encode_queries(queries)).sum(axis=1)
    assert int8.precision == "int8" and cos.min() > 0.9  # close, not equal: the quality gate decides
    # cached: a second call exports nothing
    mtime = fp32_path.stat().st_mtime_ns
    assert ensure_export(torch_enc, tmp_path, "onnx-fp32") == fp32_path
    assert fp32_path.stat().st_mtime_ns == mtime
    assert onnx_enc.describe()["model_fingerprint"] == meta["file_sha256"][:16]


def test_onnx_export_follows_the_weights(tiny_models: Path, tmp_path: Path) -> None:
    """Changed weights get a new fingerprint (a new export); a tampered file is exported again."""
    pytest.importorskip("onnxruntime")
    from searchrl.retrieval.encoders.export import ensure_export, read_sidecar, weights_fingerprint

    enc = Encoder.load(str(tiny_models / "e5-tiny"), device="cpu", precision="fp32")
    first = weights_fingerprint(enc)
    path = ensure_export(enc, tmp_path, "onnx-fp32")
    with path.open("ab") as f:
        f.write(b"\0")
    assert read_sidecar(path) is None  # no longer matches its recorded sha256
    again = ensure_export(enc, tmp_path, "onnx-fp32")
    assert again == path and read_sidecar(path) is not None
    with torch.no_grad():
        next(enc.model.parameters()).add_(0.01)
    assert weights_fingerprint(enc) != first


def test_int8_is_refused_on_the_torch_path() -> None:
    with pytest.raises(ConfigError, match="int8 runs on ONNX Runtime only"):
        Encoder.load("bundled-minilm", device="cpu", precision="int8")
