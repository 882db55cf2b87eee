"""An index build picks its passage precision by measurement (issue 47): bf16 only with the CPU flag, a measured
speed-up and every sampled vector near its fp32 twin; the choice is logged and kept in the manifest."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from searchrl.retrieval.encoders import precision, tuning
from searchrl.retrieval.encoders.encoder import Encoder
from searchrl.retrieval.encoders.precision import MIN_COSINE, MIN_SPEEDUP, choose_build_encoder
from searchrl.retrieval.index.build import ensure_index, load_manifest
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS

pytest.importorskip("faiss")

NATIVE = {"avx2", "avx512f", "avx512_bf16"}


def _timed_at(seconds_per_passage: dict[str, float], calls: list[str]):  # type: ignore[no-untyped-def]
    """timed_encode that encodes for real but reports a chosen speed per precision."""

    def timed(encoder: Encoder, passages: list[str], batch_size: int) -> tuple[float, np.ndarray]:
        calls.append(encoder.precision)
        return seconds_per_passage[encoder.precision] * len(passages), encoder.encode_passages(passages)

    return timed


def test_without_native_bf16_or_on_a_small_corpus_fp32_is_kept_unmeasured(
    minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(precision, "timed_encode", _timed_at({"fp32": 1, "bf16": 0.1}, calls))
    chosen, why = choose_build_encoder(minilm, TINY_CORPUS, 50_000, flags={"avx2", "avx512f", "avx512_vnni"})
    assert chosen is minilm and why == "fp32: this CPU has no native BF16 (bf16 would be emulated)"
    chosen, why = choose_build_encoder(minilm, TINY_CORPUS, 20, flags=NATIVE)
    assert chosen is minilm and why.startswith("fp32: 20 passages are too few")
    assert calls == []


def test_bf16_is_chosen_only_when_it_measures_fast_enough(
    minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "MIN_CORPUS", 0)
    calls: list[str] = []
    monkeypatch.setattr(precision, "timed_encode", _timed_at({"fp32": 1.0, "bf16": 0.5}, calls))
    chosen, why = choose_build_encoder(minilm, TINY_CORPUS, 20, flags=NATIVE)
    assert chosen.precision == "bf16" and minilm.precision == "fp32"  # the served encoder is left as it was
    assert calls == ["fp32", "bf16", "fp32", "bf16"]  # interleaved halves of the sample
    assert why.startswith("bf16: the first 20 passages at 2.0 passages/s in bf16, 1.0 in fp32 (2.00x)")
    cosine = float(why.rsplit(">= ", 1)[1])
    assert MIN_COSINE <= cosine < 1.0  # a real bf16 pass: near fp32, not equal
    slow = 1.0 / (MIN_SPEEDUP - 0.05)
    monkeypatch.setattr(precision, "timed_encode", _timed_at({"fp32": 1.0, "bf16": slow}, []))
    chosen, why = choose_build_encoder(minilm, TINY_CORPUS, 20, flags=NATIVE)
    assert chosen is minilm and why.startswith("fp32: bf16 is not fast enough here") and "1.15x" in why


def test_a_bf16_that_moves_vectors_is_refused_however_fast(
    minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    real_twin = precision.bf16_twin

    def drifting(encoder: Encoder) -> Encoder:
        twin = real_twin(encoder)
        with torch.no_grad():  # a model whose bf16 pass goes wrong: one layer's output projection zeroed
            twin.model.encoder.layer[0].output.dense.weight.zero_()
        return twin

    monkeypatch.setattr(precision, "MIN_CORPUS", 0)
    monkeypatch.setattr(precision, "bf16_twin", drifting)
    monkeypatch.setattr(precision, "timed_encode", _timed_at({"fp32": 1.0, "bf16": 0.1}, []))
    chosen, why = choose_build_encoder(minilm, TINY_CORPUS, 20, flags=NATIVE)
    assert chosen is minilm and why.startswith("fp32: bf16 moved a passage vector too far")


def test_an_auto_build_logs_its_choice_and_the_manifest_keeps_it(
    tmp_path: Path, minilm: Encoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precision, "MIN_CORPUS", 0)
    monkeypatch.setattr(tuning, "cpu_info", lambda: {"flags": sorted(NATIVE)})
    monkeypatch.setattr(precision, "timed_encode", _timed_at({"fp32": 1.0, "bf16": 0.5}, []))
    caplog.set_level(logging.INFO, logger="searchrl.retrieval.index.build")
    base = RetrievalSettings(backend="dense", corpus=str(TINY_CORPUS), device="cpu")
    auto = base.model_copy(update={"data_dir": tmp_path / "auto"})
    manifest = load_manifest(ensure_index(auto, "dense", encoder_factory=lambda: minilm))
    assert manifest.encoder is not None and manifest.encoder["precision"] == "bf16"
    assert "encoder=bundled-minilm (bf16) dim=384" in manifest.summary()
    assert "dense index build encodes passages in bf16: the first 20 passages" in caplog.text
    # an explicit precision is built as asked, without measuring
    fixed = base.model_copy(update={"data_dir": tmp_path / "fp32", "precision": "fp32"})
    caplog.clear()
    manifest = load_manifest(ensure_index(fixed, "dense", encoder_factory=lambda: minilm))
    assert manifest.encoder is not None and manifest.encoder["precision"] == "fp32"
    assert "encodes passages in" not in caplog.text
