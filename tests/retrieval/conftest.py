"""Fixtures shared by the retrieval tests: the fake web-search APIs (Custom Search, Serper, SearXNG), the bundled
MiniLM, tiny BERTs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.retrieval.fake_web import FakeSearchAPIs, serve_fake

if TYPE_CHECKING:
    from searchrl.retrieval.encoders.encoder import Encoder


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeSearchAPIs]:
    """One real uvicorn fake on a loopback port for the whole session."""
    with serve_fake() as apis:
        yield apis


@pytest.fixture
def fake(fake_server: FakeSearchAPIs) -> FakeSearchAPIs:
    """The fake with its counters, scripted failures and budget state cleared."""
    fake_server.reset()
    return fake_server


@pytest.fixture(scope="session")
def minilm() -> Encoder:
    """The bundled MiniLM on CPU at fp32 (max_length 256), loaded once for every test that encodes with it."""
    from searchrl.retrieval.encoders.encoder import Encoder

    return Encoder.load("bundled-minilm", device="cpu", precision="fp32")


def write_tiny_bert(folder: Path) -> Path:
    """A randomly initialised 1-layer BERT with the bundled MiniLM's tokenizer, saved in `folder` (named like the
    model family it stands in for: weights cannot be downloaded here, and the family conventions go by name)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from searchrl.retrieval.encoders.encoder import bundled_minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_minilm_path()))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
