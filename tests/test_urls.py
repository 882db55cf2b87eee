"""One parser for RETRIEVAL_SERVICE_URL (searchrl/urls.py): every reader gets the same list from the same value.

Before, the trainer's settings kept a trailing slash that inference's dropped, and `searchrl sky train`, the node's
corpus gate and `searchrl health` each split the value themselves (issue 54 item 5).
"""

from __future__ import annotations

import pytest

from searchrl.urls import redact_url, scheme_problem, split_urls

VALUE = " http://a:8000/ ,, https://b.example/base/ ,http://c:1"
EXPECTED = ["http://a:8000", "https://b.example/base", "http://c:1"]


def test_split_urls_strips_drops_blanks_and_the_trailing_slash():
    assert split_urls(VALUE) == EXPECTED
    assert split_urls(["http://a:8000/", "https://b.example/base/,http://c:1"]) == EXPECTED  # argv items
    assert split_urls(" , /,") == []


def test_the_scheme_check_never_shows_a_credential():
    assert scheme_problem("https://x") is None
    problem = scheme_problem("ftp://user:secret@h:21/p")
    assert problem == "retrieval URL 'ftp://***@h:21/p' must start with http:// or https://"
    assert redact_url("http://u:p@h/x") == "http://***@h/x"


def test_every_reader_of_retrieval_service_url_gets_the_same_list(monkeypatch, tmp_path, capsys):
    from searchrl import corpus_gate
    from searchrl.cli import main
    from searchrl.infer.settings import InferSettings
    from searchrl.retrieval import client
    from searchrl.retrieval.client.health import HealthResult
    from searchrl.trainer.settings import TrainSettings

    monkeypatch.setenv("RETRIEVAL_SERVICE_URL", VALUE)
    assert TrainSettings(data_dir=tmp_path).retrieval_urls == EXPECTED
    assert InferSettings().retrieval_urls == EXPECTED

    asked: list[str] = []
    monkeypatch.setattr(corpus_gate, "fetch_info", lambda url, key: asked.append(url))
    assert corpus_gate.main() == 0
    assert asked == EXPECTED

    checked: list[str] = []

    def check_health(url, api_key, **kw):
        checked.append(url)
        return HealthResult(ok=True, reason="ok")

    monkeypatch.setattr(client, "check_health", check_health)
    assert main(["health", VALUE]) == 0
    assert checked == EXPECTED


@pytest.mark.parametrize("bad", ["ftp://u:p@h/x", "h:8000"])
def test_both_settings_refuse_a_url_without_http_in_one_line(monkeypatch, tmp_path, bad):
    """Through load_settings, as the CLI builds them: one line naming the knob, no password."""
    from searchrl.config import load_settings
    from searchrl.errors import ConfigError
    from searchrl.infer.settings import InferSettings
    from searchrl.trainer.settings import TrainSettings

    monkeypatch.setenv("RETRIEVAL_SERVICE_URL", f"http://ok:1,{bad}")
    for cls, kw in ((TrainSettings, {"data_dir": tmp_path}), (InferSettings, {})):
        with pytest.raises(
            ConfigError, match="retrieval URL '.*' must start with http:// or https://"
        ) as info:
            load_settings(cls, **kw)
        assert "p@" not in str(info.value) and "\n" not in str(info.value)
