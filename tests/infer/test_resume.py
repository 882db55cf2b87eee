"""Resumable runs and comparable runs: a killed eval resumes to the uninterrupted result; compare refuses
runs over different questions or rules, naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tenacity import RetryCallState

from searchrl.cli import main
from searchrl.errors import ConfigError, RetryableError
from searchrl.http import backoff_s, retry_after_s, wait_backoff
from searchrl.infer.comparison import check_comparable
from searchrl.infer.llm import ServerLLM
from searchrl.infer.runs import load_runs
from tests.conftest import TINY_QA
from tests.infer.conftest import serve_scripts
from tests.infer.test_agent import MODEL, TRAINED

VOLATILE = {"latency_s", "model_s", "wall_s"}


def eval_argv(llm_url: str, retrieval_url: str, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--model", MODEL,
        "--tokenizer", str(tokenizer),
        "--llm-url", llm_url,
        "--retrieval-url", retrieval_url,
        "--qa", str(TINY_QA),
        "--max-turns", "2",
        "--concurrency", "1",
        "--output-dir", str(out),
        *extra,
    ]  # fmt: skip


def _stable(doc: dict) -> list[dict]:
    return [{k: v for k, v in q.items() if k not in VOLATILE} for q in doc["questions"]]


@pytest.mark.live
def test_killed_run_resumes_to_the_uninterrupted_result(
    live_bm25_url: str,
    chat_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SEARCHRL_INFER_LLM_MAX_RETRIES", "0")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    for llm_url, app in serve_scripts({MODEL: TRAINED}):
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, whole)) == 0
        # The LLM server dies after 3 generations: q003 (2 turns) is done, q008 is cut in its second turn.
        app.state.requests.clear()
        app.state.fail_after = 3
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, killed)) == 2
        assert "failed after 1 attempts" in capsys.readouterr().err
        (partial,) = killed.glob("*.jsonl")
        assert not list(killed.glob("*.json"))  # no final file from a run that did not finish
        lines = partial.read_text().splitlines()
        assert len(lines) == 2 and json.loads(lines[1])["id"] == "q003"  # header + one question
        with partial.open("a") as f:
            f.write('{"id": "q008", "data_so')  # and the process was killed mid-write
        # Same command again, server back: it skips q003 and finishes the rest.
        app.state.fail_after = None
        app.state.requests.clear()
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, killed)) == 0
        first_turns = [r for r in app.state.requests if r["prompt"].count("<|im_start|>assistant") == 1]
        assert len(first_turns) == 4  # q008, q013, q018, q023 only
    (a,) = whole.glob("*.json")
    (b,) = killed.glob("*.json")
    assert a.name == b.name  # same protocol, same hash in the name
    doc_a, doc_b = json.loads(a.read_text()), json.loads(b.read_text())
    assert _stable(doc_a) == _stable(doc_b)
    assert doc_a["summary"]["em"] == doc_b["summary"]["em"] == pytest.approx(0.6)

    # A changed protocol goes to another file: nothing is overwritten.
    for llm_url, _ in serve_scripts({MODEL: TRAINED}):
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, whole, "--max-turns", "1")) == 0
    names = sorted(p.name for p in whole.glob("*.json"))
    assert len(names) == 2 and names[0].split("-")[:-1] == names[1].split("-")[:-1]
    one_turn = [n for n in names if json.loads((whole / n).read_text())["protocol"]["max_turns"] == 1]
    (whole / one_turn[0]).unlink()  # two runs may not share a label in one report: re-run it with its own
    for llm_url, _ in serve_scripts({MODEL: TRAINED}):
        argv = eval_argv(
            llm_url, live_bm25_url, chat_tokenizer_dir, whole, "--max-turns", "1", "--label", "one turn"
        )
        assert main(argv) == 0
    # the resumed file was completed on a fresh line, so every line of it parses
    assert all(json.loads(line) for line in b.with_suffix(".jsonl").read_text().splitlines()[3:])

    # compare refuses these two: different rules (max_turns), named; --allow-protocol-diff builds the report anyway
    capsys.readouterr()
    assert main(["compare", str(whole), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert (
        "protocols differ in rollout.max_turns: " in err and " vs " in err and "--allow-protocol-diff" in err
    )
    assert main(["compare", str(whole), "--allow-protocol-diff", "--out", str(tmp_path / "rep")]) == 0


def _doc(ids: list[str], *, max_turns: int = 4, label: str = "run") -> dict:
    qs = [
        {"id": i, "data_source": "nq", "em": 1.0, "f1": 1.0, "searches": 1, "turns": 2, "format_valid": True}
        for i in ids
    ]
    return {
        "protocol": {
            "label": label,
            "rollout": {"max_turns": max_turns},
            "qa": {"sha256": "x", "n": len(ids)},
        },
        "summary": {"valid": True},
        "per_dataset": {},
        "questions": qs,
    }


def test_compare_refuses_different_question_sets() -> None:
    a, b = _doc(["1", "2", "3"], label="a"), _doc(["1", "2", "4", "5"], label="b")
    with pytest.raises(
        ConfigError, match=r"'b' has 2 questions 'a' lacks and lacks 1 of its 3.*--allow-question-diff"
    ):
        check_comparable([a, b])
    assert "question sets differ" in check_comparable([a, b], allow_question_diff=True)[0]
    check_comparable([a, _doc(["3", "2", "1"], label="c")])  # order does not matter


def test_compare_cli_refuses_mismatched_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_doc(["1", "2"], label="a")))
    (tmp_path / "b.json").write_text(json.dumps(_doc(["1", "3"], label="b")))
    assert len(load_runs([tmp_path])) == 2
    assert main(["compare", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: runs are not comparable: 'b' has 1 questions 'a' lacks")


def test_llm_retries_back_off_for_minutes() -> None:
    llm = ServerLLM("http://llm.test/v1", "m")  # its defaults: 8 retries, 2 s doubling up to 120 s
    waits = [
        backoff_s(k, base_s=llm.retry_base_s, max_s=llm.retry_max_wait_s) for k in range(llm.max_retries)
    ]
    assert 180 <= sum(waits) <= 370 and max(waits) <= 120
    wait = wait_backoff(llm.retry_base_s, llm.retry_max_wait_s)
    assert (
        wait(_failed_once(retry_after_s("45"))) == 45.0 and wait(_failed_once(retry_after_s("999"))) == 120.0
    )


def _failed_once(retry_after: float | None) -> RetryCallState:
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    error = RetryableError("HTTP 503", retry_after=retry_after)
    state.set_exception((RetryableError, error, None))
    return state
