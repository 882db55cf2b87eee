"""RetrievalSettings refuses configurations that would start and then fail every query (issue 27)."""

from __future__ import annotations

import pytest

from searchrl.cli import main
from searchrl.config import load_settings
from searchrl.errors import ConfigError
from searchrl.retrieval.settings import RetrievalSettings


def test_searxng_needs_a_base_url() -> None:
    # there is no default instance: 127.0.0.1:8888 used to pass /ready while every /retrieve was a 502
    with pytest.raises(
        ConfigError, match=r"backend searxng needs SEARCHRL_RETRIEVAL_SEARXNG_BASE_URL.*not set"
    ):
        load_settings(RetrievalSettings, backend="searxng")
    with pytest.raises(ConfigError, match=r"got 'searx.local:8888'"):
        load_settings(RetrievalSettings, backend="searxng", searxng_base_url="searx.local:8888")
    settings = load_settings(RetrievalSettings, backend="searxng", searxng_base_url="http://127.0.0.1:8888")
    assert settings.searxng_base_url == "http://127.0.0.1:8888"
    assert (
        load_settings(RetrievalSettings, backend="bm25").searxng_base_url == ""
    )  # other backends: not needed


def test_serve_searxng_without_url_exits_2_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "searchrl.retrieval.serving.server.run_server", lambda _s: pytest.fail("started anyway")
    )
    assert main(["serve", "--backend", "searxng"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "SEARCHRL_RETRIEVAL_SEARXNG_BASE_URL" in err
