"""Failures are counted and bounded: quota, dead upstream and replay misses against the REAL retrieval service.

The retrieval service is our FastAPI app on a loopback port with a web backend (Serper) whose upstream is the
fake in tests/retrieval/fake_web.py, speaking Serper's wire format; only the LLM is scripted. On the old code
each of these runs "succeeded" with a normal-looking table.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.infer.report import load_runs
from searchrl.retrieval.app import create_app
from tests.infer.conftest import serve_scripts
from tests.infer.test_agent import MODEL, TRAINED
from tests.infer.test_resume import eval_argv
from tests.live import serve_in_thread
from tests.retrieval.fake_web import FakeSearchAPIs, serve_fake, web_settings

pytestmark = pytest.mark.live


@pytest.fixture()
def fake() -> Iterator[FakeSearchAPIs]:
    with serve_fake() as apis:
        yield apis


def _eval_argv(llm_url: str, retrieval_url: str, tokenizer: Path, out: Path) -> list[str]:
    return eval_argv(llm_url, retrieval_url, tokenizer, out, "--label", "trained over serper")


def _error_line(stderr: str) -> str:
    """The CLI's one `error:` line (the test's service logs its drain to stderr after the CLI returns)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")][-1]


def test_spent_quota_stops_the_run_and_marks_it_invalid(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # budget 2: the pre-flight query, q003's one search; q008's first search hits the quota (HTTP 429).
    settings = web_settings(fake, backend="serper", web_daily_budget=2, data_dir=tmp_path / "svc")
    with serve_in_thread(create_app(settings)) as retrieval_url:
        for llm_url, _ in serve_scripts({MODEL: TRAINED}):
            rc = main(_eval_argv(llm_url, retrieval_url, chat_tokenizer_dir, tmp_path / "results"))
    assert rc == 2
    err = _error_line(capsys.readouterr().err)
    assert err.startswith("error: run stopped: the search quota is spent (429)") and "re-run" in err
    (path,) = (tmp_path / "results").glob("*.json")
    doc = json.loads(path.read_text())
    s = doc["summary"]
    assert s["valid"] is False and s["aborted"].startswith("http_429")
    # q003 finished (1 search, right answer); the run stopped on the first quota error, nothing after it
    assert [q["id"] for q in doc["questions"]] == ["q003"] and doc["questions"][0]["em"] == 1.0
    assert fake.count("serper") == 2  # no request past the budget reached the provider

    # compare refuses the invalid run, and with --allow-invalid the report flags it with its counts
    assert main(["compare", str(path), "--out", str(tmp_path / "rep")]) == 2
    assert "invalid run(s)" in capsys.readouterr().err
    assert main(["compare", str(path), "--allow-invalid", "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "**NO**: aborted: http_429" in md


def test_dead_upstream_is_counted_by_kind_and_marks_the_run_invalid(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = web_settings(
        fake, backend="serper", web_daily_budget=0, web_max_retries=0, data_dir=tmp_path / "s"
    )
    with serve_in_thread(create_app(settings)) as retrieval_url:
        # the pre-flight search is answered; then the provider is down for good (HTTP 503 on every request)
        fake.plan = deque([None] + ["503"] * 1000)
        for llm_url, _ in serve_scripts({MODEL: TRAINED}):
            rc = main(_eval_argv(llm_url, retrieval_url, chat_tokenizer_dir, tmp_path / "results"))
    assert rc == 2
    captured = capsys.readouterr()
    assert "error: run INVALID, do not quote it" in captured.err
    (path,) = (tmp_path / "results").glob("*.json")
    doc = json.loads(path.read_text())
    s = doc["summary"]
    # q003 1 search, q008 2, q023 2 (max 2 turns): 5 failed searches, as the service reports them (502)
    assert s["search_failures"] == 5 and s["failure_kinds"] == {"http_502": 5}
    assert s["questions_failed"] == 3 and s["failure_rate"] == pytest.approx(0.6)
    assert s["valid"] is False and "above the 2.0% limit" in s["invalid_reason"]
    # the table on stdout shows the failure columns, and the run is marked invalid in it
    assert (
        "| 5 (http_502 5) | 0 | 0 | malformed_tool_call 1, max_turns 1, no_tool_call 3 | **NO**:"
        in captured.out
    )
    (run,) = load_runs([path])
    assert run["summary"]["questions_failed"] == 3


def test_replay_miss_fails_the_preflight_before_any_generation(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = web_settings(
        fake,
        backend="serper",
        cache_mode="replay",
        cache_path=tmp_path / "empty.sqlite",
        data_dir=tmp_path / "s",
    )
    with serve_in_thread(create_app(settings)) as retrieval_url:
        for llm_url, app in serve_scripts({MODEL: TRAINED}):
            rc = main(_eval_argv(llm_url, retrieval_url, chat_tokenizer_dir, tmp_path / "results"))
            assert app.state.requests == []  # no generation was spent
    assert rc == 2
    err = _error_line(capsys.readouterr().err)
    assert err.startswith("error: pre-flight search") and "replay-cache miss" in err
    assert not list((tmp_path / "results").glob("*.json")) if (tmp_path / "results").exists() else True
