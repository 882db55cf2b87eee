"""`searchrl eval`: QA loading, scoring parity with verl, and a full run into a result file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from verl.utils.reward_score import search_r1_like_qa_em as verl_em

from searchrl.cli import main
from searchrl.errors import DataError
from searchrl.infer.evaluate import load_qa, paper_table, summarize
from searchrl.prompt import PROMPT_VERSION
from searchrl.scoring import score_response
from tests.conftest import TINY_QA
from tests.infer.conftest import serve_scripts
from tests.infer.test_agent import MODEL, TRAINED

TRICKY = [
    ("<answer> The Ingmar Bergman! </answer>", ["Ingmar Bergman"]),
    ("<answer>an Analytical  Engine</answer>", ["analytical engine"]),
    ("<answer>a</answer> then <answer>24</answer>", ["24", "twenty-four"]),
    ("<answer>25</answer>", ["24"]),
    ("no answer tags at all", ["Rashi"]),
    ("<answer>Rashi</answer>" * 11, ["Rashi"]),  # sprayed answer tags: a quarter of the score
    ("<answer>\nRashi.\n</answer>", ["rashi"]),
]


@pytest.mark.parametrize(("response", "golden"), TRICKY)
def test_em_matches_verl(response: str, golden: list[str]) -> None:
    ours = score_response(response, golden)
    assert ours.em == verl_em.compute_score(response, {"target": golden})
    assert ours.answer == verl_em.extract_solution(response)
    if ours.answer is not None:
        assert bool(ours.em) == bool(verl_em.em_check(ours.answer, golden))
        assert ours.f1 >= (1.0 if verl_em.em_check(ours.answer, golden) else 0.0)


def test_load_jsonl_and_filters() -> None:
    items, path = load_qa(str(TINY_QA))
    assert path == TINY_QA and len(items) == 5
    assert items[0].golden_answers == ["Ingmar Bergman", "Bergman"] and items[0].data_source == "dev"
    sub, _ = load_qa(str(TINY_QA), limit=2, seed=1)
    again, _ = load_qa(str(TINY_QA), limit=2, seed=1)
    assert len(sub) == 2 and sub == again
    assert [i.id for i in sub] == sorted(i.id for i in sub)  # input order kept


def test_load_searchr1_parquet(tmp_path: Path) -> None:
    """The Search-R1 test parquet layout: data_source, prompt, reward_model.ground_truth.target."""
    rows = []
    for i, (src, q, gold) in enumerate(
        [
            ("nq", "who wrote hamlet", ["Shakespeare"]),
            ("hotpotqa", "capital of france", ["Paris"]),
            ("nq", "x", ["y"]),
        ]
    ):
        rows.append(
            {
                "id": f"{src}_{i}",
                "data_source": src,
                "prompt": [{"role": "user", "content": f"Answer the given question. ... Question: {q}?\n"}],
                "reward_model": {"style": "rule", "ground_truth": {"target": np.array(gold)}},
            }
        )
    path = tmp_path / "test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    items, _ = load_qa(str(path))
    assert [(i.data_source, i.question, i.golden_answers) for i in items][:2] == [
        ("nq", "who wrote hamlet?", ["Shakespeare"]),
        ("hotpotqa", "capital of france?", ["Paris"]),
    ]
    only, _ = load_qa(str(path), datasets=["hotpotqa"])
    assert [i.id for i in only] == ["hotpotqa_1"]
    with pytest.raises(DataError, match="no rows with data_source"):
        load_qa(str(path), datasets=["musique"])


def test_bad_qa_rows_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "golden_answers": ["a"]}\n{"question": "no answers"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        load_qa(str(bad))
    with pytest.raises(DataError, match="not found"):
        load_qa(str(tmp_path / "missing.jsonl"))


def test_summary_avg_is_macro() -> None:
    q = [
        {
            "data_source": "nq",
            "em": 1.0,
            "f1": 1.0,
            "searches": 1,
            "turns": 2,
            "format_valid": True,
            "latency_s": 1,
            "stop_reason": "x",
            "error": None,
        },
        {
            "data_source": "nq",
            "em": 1.0,
            "f1": 1.0,
            "searches": 1,
            "turns": 2,
            "format_valid": True,
            "latency_s": 1,
            "stop_reason": "x",
            "error": None,
        },
        {
            "data_source": "hotpotqa",
            "em": 0.0,
            "f1": 0.5,
            "searches": 3,
            "turns": 4,
            "format_valid": False,
            "latency_s": 1,
            "stop_reason": "x",
            "error": None,
        },
    ]
    summary, per = summarize(q)
    assert list(per) == ["nq", "hotpotqa"]  # paper column order
    assert summary["em_avg"] == 0.5 and summary["em"] == pytest.approx(2 / 3)


@pytest.mark.live
def test_searchrl_eval_writes_protocol_and_scores(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for llm_url, _ in serve_scripts({MODEL: TRAINED}):
        rc = main(
            [
                "eval",
                "--model", MODEL,
                "--tokenizer", str(chat_tokenizer_dir),
                "--llm-url", llm_url,
                "--retrieval-url", live_bm25_url,
                "--qa", str(TINY_QA),
                "--max-turns", "2",
                "--seed", "7",
                "--output-dir", str(tmp_path),
            ]
        )  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    p = doc["protocol"]
    assert p["model"] == MODEL and p["endpoint"] == llm_url and p["engine"] == "server"
    assert p["retrieval"]["backend"] == "bm25" and p["retrieval"]["corpus"].endswith("tiny_corpus.jsonl")
    assert (p["topk"], p["max_turns"], p["temperature"], p["seed"], p["prompt_version"]) == (
        3,
        2,
        0.0,
        7,
        PROMPT_VERSION,
    )
    assert (p["passage_max_chars"], p["max_observation_chars"]) == (800, 3 * (800 + 96) + 96)
    assert p["qa"]["n"] == 5 and len(p["qa"]["sha256"]) == 64 and p["chat_template_sha256"]
    by_id = {q["id"]: q for q in doc["questions"]}
    assert {k: (v["em"], v["searches"], v["turns"]) for k, v in by_id.items()} == {
        "q003": (1.0, 1, 2),
        "q008": (1.0, 2, 3),
        "q013": (1.0, 0, 1),
        "q018": (0.0, 0, 1),
        "q023": (0.0, 2, 3),
    }
    for q in doc["questions"]:  # the same strings through verl's reward
        assert q["em"] == verl_em.compute_score(q["response"], {"target": q["golden_answers"]})
        assert q["answer"] == verl_em.extract_solution(q["response"])
        assert q["latency_s"] > 0 and q["transcript"][0]["role"] == "user"
    assert doc["summary"]["em"] == pytest.approx(0.6) and doc["per_dataset"]["dev"]["n"] == 5
    assert paper_table([doc]) in out and "| 0.600 |" in out
    # the client's own counters for this session: the pre-flight query plus the 5 searches above
    (replica,) = doc["retrieval_client"]["urls"].values()
    assert replica["sent"] == replica["ok"] == 1 + 5 and replica["failed"] == {}
    assert replica["breaker"] == "closed"


def test_eval_errors_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARCHRL_INFER_LLM_MAX_RETRIES", "0")
    assert main(["eval", "--qa", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: QA file") and "nope.jsonl" in err[-1]
    assert main(["eval", "--qa", str(TINY_QA), "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    # nothing listens on the discard port (9): first the retrieval service is down, then the LLM server
    dead = "http://127.0.0.1:9"
    assert main(["eval", "--qa", str(TINY_QA), "--retrieval-url", dead, "--output-dir", str(tmp_path)]) == 2
    assert "no retrieval service answered" in capsys.readouterr().err
    rc = main(
        [
            "eval",
            "--qa",
            str(TINY_QA),
            "--no-search",
            "--llm-url",
            dead + "/v1",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert rc == 2
    assert "start sglang/vLLM there or set --llm-url" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
