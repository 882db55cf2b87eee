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
from searchrl.infer.qa import load_qa
from searchrl.infer.summary import paper_table, summarize
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
    def row(source: str, em: float, f1: float, searches: int, turns: int, valid: bool) -> dict[str, object]:
        return {
            "data_source": source, "em": em, "f1": f1, "searches": searches, "turns": turns,
            "format_valid": valid, "latency_s": 1, "stop_reason": "x", "error": None,
        }  # fmt: skip

    q = [
        row("nq", 1.0, 1.0, 1, 2, True),
        row("nq", 1.0, 1.0, 1, 2, True),
        row("hotpotqa", 0.0, 0.5, 3, 4, False),
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
    assert doc["summary"]["retrieval_after"] == {"url": live_bm25_url}  # GET / again after the run
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
    # which questions' observations hold a gold answer verbatim (Bergman, the Forbidden City's 24 emperors)
    leaked = {k for k, v in by_id.items() if v["answer_in_observation"]}
    assert "q003" in leaked and "q013" not in leaked  # q013 never searched
    assert doc["summary"]["answer_in_observation"] == len(leaked)
    # the retrieval identity that reaches the hash: backend and the index's own checksums
    ident = p["retrieval"]["identity"]
    assert ident["backend"] == "bm25" and ident["corpus_checksum"] and ident["index_fingerprint"]
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


def _rec(source: str, i: int, *, em: float = 1.0, kinds: dict | None = None, **extra: object) -> dict:
    kinds = kinds or {}
    return {
        "id": f"{source}{i}",
        "data_source": source,
        "em": em,
        "f1": em,
        "searches": 1,
        "turns": 2,
        "format_valid": True,
        "latency_s": 0.1,
        "stop_reason": "no_tool_call",
        "search_failures": sum(kinds.values()),
        "failure_kinds": kinds,
        **extra,
    }


def test_one_dataset_over_the_limit_makes_the_run_invalid_though_the_total_is_under_it() -> None:
    from searchrl.infer.summary import cannot_be_valid

    # nq: 2 of 10 failed (20%); hotpotqa: 190 clean. 2/200 = 1% overall, under the 2% gate.
    rows = [_rec("nq", i, kinds={"connect": 1}) for i in range(2)] + [_rec("nq", i) for i in range(2, 10)]
    rows += [_rec("hotpotqa", i, em=float(i % 2)) for i in range(190)]
    summary, per = summarize(rows)
    assert summary["failure_rate"] == pytest.approx(0.01)
    assert not summary["valid"] and summary["invalid_datasets"] == ["nq"]
    assert "nq: 2/10 questions (20.0%) failed, above the 2.0% limit" in summary["invalid_reason"]
    # failed/n in every cell, and EM both ways: failures scored 0, and over the questions that did not fail
    nq = per["nq"]
    assert (nq["failed"], nq["n"], nq["n_ok"]) == (2, 10, 8)
    assert (nq["em"], nq["em_failed_as_zero"], nq["em_ok"]) == (1.0, 0.8, 1.0)
    assert per["hotpotqa"]["failed"] == 0 and per["hotpotqa"]["em_ok"] == per["hotpotqa"]["em"] == 0.5
    # while running: the same gate over the planned counts says when nothing can save the run
    planned = {"nq": 10, "hotpotqa": 190}
    assert cannot_be_valid(rows[:1], {"nq": 100, "hotpotqa": 100}, 0.02) is None  # 1%: still possible
    assert cannot_be_valid(rows[:1], planned, 0.02) == (
        "nq: 1 of its 10 questions failed already, above the 2.0% limit"
    )
    spread = [rows[0], _rec("hotpotqa", 0, kinds={"http_502": 1})]
    assert cannot_be_valid(spread, {"nq": 60, "hotpotqa": 60}, 0.02) is None
    assert cannot_be_valid(spread, {"nq": 60, "hotpotqa": 60}, 0.01) == (
        "2 of 120 questions failed already, above the 1.0% limit"
    )


def test_model_mistakes_are_behaviour_not_failures() -> None:
    # a file written before model_errors existed counted bad_arguments among the failure kinds
    old = _rec("nq", 0, kinds={"bad_arguments": 2})
    new = _rec("nq", 1, model_errors={"empty_query": 1}, malformed_calls=1)
    summary, per = summarize([old, new, _rec("nq", 2)])
    assert summary["valid"] and summary["questions_failed"] == 0 and summary["search_failures"] == 0
    assert summary["failure_kinds"] == {}
    assert summary["model_errors"] == {"bad_arguments": 2, "empty_query": 1, "malformed_call": 1}
    assert per["nq"]["questions_with_model_errors"] == 2


def test_limit_draws_the_same_questions_per_dataset_however_the_run_is_split(tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    rows = [
        {"id": f"{s}{i}", "question": f"q {s} {i}", "golden_answers": ["a"], "data_source": s}
        for s in ("nq", "hotpotqa")
        for i in range(20)
    ]
    qa.write_text("\n".join(json.dumps(r) for r in rows))
    both, _ = load_qa(str(qa), limit=3, seed=7)
    nq, _ = load_qa(str(qa), datasets=["nq"], limit=3, seed=7)
    hp, _ = load_qa(str(qa), datasets=["hotpotqa"], limit=3, seed=7)
    assert [i.id for i in both] == [i.id for i in nq + hp]  # nq rows come first in the file
    other, _ = load_qa(str(qa), limit=3, seed=8)
    assert {i.id for i in other} != {i.id for i in both}


def test_retrieval_identity_reaches_the_hash() -> None:
    from searchrl.infer.protocol import build_protocol, retrieval_identity
    from searchrl.infer.settings import InferSettings

    web = {"backend": "serper", "provider": "serper", "page_mode": "snippets", "gl": "us", "hl": "en",
           "blocked_results": 3, "upstream": "https://google.serper.dev/search"}  # fmt: skip
    part = {"backend": "dense", "corpus_checksum": "c1", "index_fingerprint": "f1", "corpus": "wiki-18"}
    hybrid = {"backend": "hybrid", "rrf_k": 60, "weights": {"dense": 1.0, "bm25": 1.0}, "depth": 50,
              "parts": [part, {"backend": "bm25", "corpus_checksum": "c1", "index_fingerprint": "b1"}]}  # fmt: skip
    s = InferSettings()

    def h(info: dict) -> str:
        return build_protocol(s, retrieval_info=info, qa_path=TINY_QA, n_questions=5, chat_template=None)[
            "protocol_hash"
        ]

    base = h(web)
    assert h({**web, "blocked_results": 9}) == base  # counters are not identity
    for change in ({"page_mode": "pages"}, {"provider": "google-cse"}, {"gl": "de"}, {"hl": "de"}):
        assert h({**web, **change}) != base, change
    hb = h(hybrid)
    other_index = {**hybrid, "parts": [{**part, "index_fingerprint": "f2"}, hybrid["parts"][1]]}
    assert h(other_index) != hb and h({**hybrid, "rrf_k": 30}) != hb
    assert retrieval_identity(hybrid)["parts"][0] == part


def test_answer_in_observation() -> None:
    from searchrl.infer.summary import answer_in_observation

    transcript = [
        {"role": "user", "content": "Who wrote it? Ingmar Bergman"},
        {"role": "tool", "content": "Doc 1 (Title: The Seventh Seal) directed by INGMAR BERGMAN"},
    ]
    assert answer_in_observation(transcript, ["Ingmar Bergman"])
    assert not answer_in_observation(transcript[:1], ["Ingmar Bergman"])  # the question does not count
    assert not answer_in_observation(transcript, ["Kurosawa", " "])


def test_default_labels_tell_one_models_runs_apart() -> None:
    """Two prompt formats of one model used to share a label, and `searchrl compare` refused them."""
    from searchrl.infer.protocol import default_label
    from searchrl.infer.settings import InferSettings

    s = InferSettings(model="data/models/smollm2-135m")
    labels = [
        default_label(s, "bm25"),
        default_label(InferSettings(model=s.model, prompt_format="search-r1"), "bm25"),
        default_label(InferSettings(model=s.model, chat_template="searchrl"), "bm25"),
        default_label(InferSettings(model=s.model, search=False, prompt_format="search-r1"), "bm25"),
    ]
    assert labels == [
        "smollm2-135m, bm25, search",
        "smollm2-135m, bm25, search, search-r1 format",
        "smollm2-135m, bm25, search, searchrl template",
        "smollm2-135m, none, no-search, search-r1 format",
    ]
