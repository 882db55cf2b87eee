"""Failures are counted and bounded: quota, dead upstream and replay misses against the REAL retrieval service.

The retrieval service is our FastAPI app on a loopback port with a web backend (Serper) whose upstream is the
fake in tests/retrieval/fake_web.py, speaking Serper's wire format; only the LLM is scripted. On the old code
each of these runs "succeeded" with a normal-looking table.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import main
from searchrl.infer.runs import load_runs
from searchrl.retrieval.serving.app import create_app
from tests.conftest import TINY_QA
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


@contextlib.contextmanager
def _outage(
    fake: FakeSearchAPIs, tokenizer: Path, tmp_path: Path, answered: int
) -> Iterator[tuple[list[str], Any, Path]]:
    """An eval's argv against the real service over Serper (no daily budget, no retries) whose upstream answers
    the first `answered` searches and then only 503s; with the scripted LLM's app (its requests) and the folder
    the results go to."""
    settings = web_settings(
        fake, backend="serper", web_daily_budget=0, web_max_retries=0, data_dir=tmp_path / "s"
    )
    out = tmp_path / "results"
    with serve_in_thread(create_app(settings)) as retrieval_url:
        fake.plan = deque([None] * answered + ["503"] * 1000)
        for llm_url, app in serve_scripts({MODEL: TRAINED}):
            yield _eval_argv(llm_url, retrieval_url, tokenizer, out), app, out


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
            argv = _eval_argv(llm_url, retrieval_url, chat_tokenizer_dir, tmp_path / "results")
            rc = main([*argv, "--keep-going"])  # no early stop: every failure gets counted
    assert rc == 2
    captured = capsys.readouterr()
    assert "error: run INVALID, do not quote it" in captured.err and "--retry-failed" in captured.err
    (path,) = (tmp_path / "results").glob("*.json")
    doc = json.loads(path.read_text())
    s = doc["summary"]
    # q003 1 search, q008 2, q023 2 (max 2 turns): 5 failed searches, as the service reports them (502)
    assert s["search_failures"] == 5 and s["failure_kinds"] == {"http_502": 5}
    assert s["questions_failed"] == 3 and s["failure_rate"] == pytest.approx(0.6)
    assert s["valid"] is False and "above the 2.0% limit" in s["invalid_reason"]
    # the table on stdout shows the failure columns, and the run is marked invalid in it
    assert (
        "| 5 (http_502 5) | 1 (malformed_call 1) | 0 | 0 | malformed_tool_call 1, max_turns 1, no_tool_call 3 | **NO**:"
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


def _first_turns(requests: list[dict]) -> list[str]:
    """The question ids whose first turn was generated, from the scripted server's request log."""
    rows = [json.loads(line) for line in TINY_QA.read_text().splitlines() if line.strip()]
    first = [r["prompt"] for r in requests if r["prompt"].count("<|im_start|>assistant") == 1]
    return sorted(row["id"] for row in rows for p in first if row["question"] in p)


def test_retry_failed_reruns_only_the_failed_questions_after_an_outage(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # pre-flight and q003's search answered, then an outage: q008 and q023 fail (q013, q018 never search)
    with _outage(fake, chat_tokenizer_dir, tmp_path, answered=2) as (argv, app, out):
        assert main([*argv, "--keep-going"]) == 2
        assert "re-run the same command with --retry-failed" in capsys.readouterr().err
        (path,) = out.glob("*.json")
        assert json.loads(path.read_text())["summary"]["questions_failed"] == 2
        # the outage is over: --retry-failed runs q008 and q023 again, and nothing else
        fake.plan.clear()
        app.state.requests.clear()
        assert main([*argv, "--retry-failed"]) == 0
        assert _first_turns(app.state.requests) == ["q008", "q023"]
        # a plain re-run now has nothing left to do
        app.state.requests.clear()
        assert main(argv) == 0 and app.state.requests == []
    doc = json.loads(path.read_text())
    s = doc["summary"]
    assert s["valid"] and s["questions_failed"] == 0 and s["em"] == pytest.approx(0.6)
    assert [q["id"] for q in doc["questions"]] == ["q003", "q008", "q013", "q018", "q023"]
    lines = [json.loads(x) for x in path.with_suffix(".jsonl").read_text().splitlines()[1:]]
    assert sorted(r["id"] for r in lines) == ["q003", "q008", "q013", "q018", "q023"]  # failed lines replaced


def test_a_run_that_can_no_longer_be_valid_stops_early_keeping_what_is_done(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _outage(fake, chat_tokenizer_dir, tmp_path, answered=1) as (argv, app, out):
        # 1 failed question of 5 is past 2% whatever the other four give: stop there
        assert main(argv) == 2
        err = _error_line(capsys.readouterr().err)
        assert err.startswith("error: run stopped early, it can no longer be valid: 1 of 5 questions")
        assert err.endswith("re-run the same command with --retry-failed")
        (path,) = out.glob("*.json")
        doc = json.loads(path.read_text())
        assert [q["id"] for q in doc["questions"]] == ["q003"] and not doc["summary"]["valid"]
        assert doc["summary"]["aborted"].startswith("stopped early")
        # a dead backend also stops a run that keeps going, after N failed searches in a row
        app.state.requests.clear()
        fake.plan = deque([None] + ["503"] * 1000)
        assert main([*argv, "--keep-going", "--max-consecutive-failures", "2", "--label", "k"]) == 2
        err = _error_line(capsys.readouterr().err)
        assert "2 searches in a row failed (last: http_502)" in err and "--max-consecutive-failures" in err
        assert _first_turns(app.state.requests) == ["q003", "q008"]


def test_a_model_that_only_writes_bad_calls_gives_a_valid_run(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = '<tool_call>\n{"name": "search", "arguments": {"query_list": []}}\n</tool_call>'
    scripts = {
        MODEL: {k: [bad] for k in ("game of chess", "Ming and Qing", "Shlomo", "fractal", "Charles Babbage")}
    }
    for llm_url, _ in serve_scripts(scripts):
        assert main(_eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, tmp_path)) == 0
    (path,) = tmp_path.glob("*.json")
    s = json.loads(path.read_text())["summary"]
    # 5 questions x 2 searching turns of calls without a query: the model's doing, reported, run valid
    assert s["valid"] and s["questions_failed"] == 0 and s["search_failures"] == 0
    assert s["model_errors"] == {"bad_arguments": 10} and s["questions_with_model_errors"] == 5
    assert "failure_kinds" in s and s["failure_kinds"] == {}
    assert "| 0 | 10 (bad_arguments 10) | 0 |" in capsys.readouterr().out  # the table's model errors column


def test_changing_the_web_provider_does_not_resume_into_the_old_results(
    fake: FakeSearchAPIs, chat_tokenizer_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    hashes = []
    # backend `google` both times (what GET / calls `backend`); only the provider behind it changes
    for provider in ("serper", "serpapi", "serper"):
        settings = web_settings(
            fake, backend="google", google_provider=provider, web_daily_budget=0, data_dir=tmp_path / provider
        )
        with serve_in_thread(create_app(settings)) as retrieval_url:
            for llm_url, app in serve_scripts({MODEL: TRAINED}):
                argv = _eval_argv(llm_url, retrieval_url, chat_tokenizer_dir, out)
                assert main([*argv, "--label", "web"]) == 0
                ran = len(app.state.requests)
        docs = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
        hashes.append((sorted(docs), ran))
    # serper, then serpapi: a second file, every question run again; serper again: resumed, nothing run
    assert len(hashes[0][0]) == 1 and len(hashes[1][0]) == 2 and hashes[1][1] > 0
    assert hashes[2] == (hashes[1][0], 0)
    idents = [json.loads((out / n).read_text())["protocol"]["retrieval"]["identity"] for n in hashes[1][0]]
    assert sorted(i["provider"] for i in idents) == ["serpapi", "serper"]
    assert {i["backend"] for i in idents} == {"google"}
