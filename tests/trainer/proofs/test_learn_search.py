"""`make learn-search` in seconds (issue 52 item 3): the question builder, the environment's openings, the verdict on
synthetic numbers (cases that must fail among them), and the CLI's bad-input errors.

The run itself (SmolLM2-135M through verl's loop on verl's vLLM server, then `searchrl eval`/`compare`; ~20+ minutes
on 2 cores) is opt-in: `pytest -m learn_search tests/trainer/e2e/test_learn_search.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.proofs.search_env import (
    ANSWER_OPENING,
    CALL_CLOSING,
    SEARCH_OPENING,
    closed_answer,
    opening_for,
    query_closing,
)
from searchrl.trainer.proofs.search_questions import (
    MASK,
    Question,
    candidates,
    first_sentence,
    make_question,
    mask_title,
    write_qa,
)
from searchrl.trainer.proofs.search_verdict import VERDICT_OK, Arm, judge, paired, table
from tests.conftest import REPO

CORPUS = REPO / "data" / "corpora" / "wiki-bundled-en.jsonl"  # what `--corpus bundled` (the default) writes


@pytest.fixture
def bundled_corpus() -> Path:
    """The default `--corpus bundled`, converted if this checkout has not yet (a fresh clone has not)."""
    from searchrl.retrieval.index.bundled import ensure_bundled_corpus

    return ensure_bundled_corpus(REPO / "data")


LION = '"Lion"\nThe lion is a large cat of the genus Panthera native to Africa and India. It has a muscular body.'


# --- the question builder -----------------------------------------------------------------------------------------


def test_a_question_masks_every_title_word_and_answers_with_the_title():
    q = make_question("7", LION)
    assert q == Question(
        "Which subject is described as: 'The ___ is a large cat of the genus Panthera native to Africa and India.'?",
        "Lion",
        "7",
    )
    assert q.qa_row() == {
        "question": q.question,
        "golden_answers": ["Lion"],
        "data_source": "reverse_lookup",
        "passage_id": "7",
    }
    masked = mask_title("Theodor Mommsen was a German classical scholar and historian.", "Theodor Mommsen")
    assert masked == f"{MASK} {MASK} was a German classical scholar and historian."


def test_passages_that_cannot_make_a_fair_question_are_left_out():
    # the title is not in the first sentence, so nothing can be masked
    assert (
        make_question("1", '"Lion"\nA large cat of the genus Panthera lives in Africa and India today.')
        is None
    )
    # disambiguated titles and titles of more than four words
    assert (
        make_question(
            "2", '"Mercury (planet)"\nMercury (planet) is the first planet from the Sun in our system.'
        )
        is None
    )
    assert (
        make_question("3", '"A B C D E"\nA B C D E is a long title of a thing that is also a test here.')
        is None
    )
    # too short a sentence
    assert make_question("4", '"Lion"\nThe lion is a cat.') is None
    # a title word surviving normalisation (a possessive) drops the question rather than leak the answer
    assert mask_title("Paris's museums and Paris are famous across the world today.", "Paris") is not None
    assert (
        first_sentence("The lion is a large cat of Africa. It roars. Many do.")
        == "The lion is a large cat of Africa."
    )


def test_candidates_are_deterministic_and_never_leak_their_answer(bundled_corpus: Path):
    first, second = candidates(bundled_corpus), candidates(bundled_corpus)
    assert first == second and len(first) > 1000
    from searchrl.scoring import normalize_answer

    for q in first[:500]:
        words = set(normalize_answer(q.question).split())
        assert not any(w in words for w in normalize_answer(q.answer).split() if len(w) >= 2), q


def test_written_questions_are_a_qa_file_eval_reads(tmp_path: Path):
    path = write_qa(tmp_path / "q" / "held.jsonl", [make_question("7", LION)])  # type: ignore[list-item]
    row = json.loads(path.read_text(encoding="utf-8"))
    assert row["golden_answers"] == ["Lion"] and row["question"].startswith("Which subject")


class _WordTokenizer:
    """One token a space-separated word (ids index a growing vocabulary): enough to count an answer cap in words."""

    def __init__(self) -> None:
        self.words: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for word in text.split(" "):
            if word not in self.words:
                self.words.append(word)
            ids.append(self.words.index(word))
        return ids

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)


def test_a_copier_of_the_passage_opening_scores_em_only_where_the_cap_cuts_after_the_title(tmp_path: Path):
    """`copied_openings`: the passage's first sentence cut at the answer cap (and at a newline or `<`), the answer a
    perfect copier would give; its EM is the context for a rise in EM under `--answer-tokens`."""
    from searchrl.scoring import exact_match
    from searchrl.trainer.proofs.search_questions import copied_openings

    corpus = tmp_path / "c.jsonl"
    rows = [
        {"id": "7", "contents": LION},
        {
            "id": "8",
            "contents": '"Denver"\nDenver is the capital and most populous city of the U.S. state of Colorado.',
        },
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    questions = [q for q in (make_question(r["id"], r["contents"]) for r in rows) if q is not None]
    assert len(questions) == 2
    tok = _WordTokenizer()
    # " The lion ..." encodes as ["", "The", "lion", ...]: a cap of 3 keeps "The lion", which EM normalises to "lion"
    three = copied_openings(corpus, questions, tok, 3)
    assert three == [" The lion", " Denver is"]
    assert copied_openings(corpus, questions, tok, 2)[1] == " Denver"
    assert [exact_match(a, [q.answer]) for a, q in zip(three, questions, strict=True)] == [1.0, 0.0]
    assert copied_openings(corpus, questions, tok, 96)[0].endswith("Africa and India.")


def test_the_format_share_scores_em_again_where_verls_dump_leaves_it_out(tmp_path: Path):
    """verl 0.9.1's rollout dump has no `em` column: run 12 (EM most of its reward) reported a format share of 1.000.
    The share now scores EM from the dumped output, as the reward does."""
    from searchrl.trainer.proofs.learn_search import format_share

    rows = [
        {"output": "<answer> Genealogy</answer>", "gts": {"target": ["Genealogy"]}, "score": 1.1},
        {"output": "<answer> Family trees</answer>", "gts": {"target": ["Genealogy"]}, "score": 0.1},
        {"output": "no answer", "gts": {"target": ["Genealogy"]}, "score": 0.0, "em": 0.0},
    ]
    (tmp_path / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert format_share(tmp_path) == pytest.approx(0.2 / 1.2)
    assert format_share(tmp_path / "none") == 0.0


# --- the declared environment -------------------------------------------------------------------------------------

SYSTEM = '<|im_start|>system\n<tools>{"name": "search"}</tools><|im_end|>\n'
USER = "<|im_start|>user\nQuestion: x?<|im_end|>\n"
HEADER = "<|im_start|>assistant\n"


def test_the_environment_opens_the_search_call_then_the_answer():
    assert opening_for(SYSTEM + USER + HEADER) == SEARCH_OPENING
    assert SEARCH_OPENING == '<tool_call>\n{"name": "search", "arguments": {"query_list": ["'
    after_tool = SYSTEM + USER + HEADER + SEARCH_OPENING + 'x"]}}\n</tool_call><|im_end|>\n'
    after_tool += (
        "<|im_start|>user\n<tool_response>\nDoc 1 (Title: X) y\n</tool_response><|im_end|>\n" + HEADER
    )
    assert opening_for(after_tool) == ANSWER_OPENING
    # search off: no tool in the system turn, the first turn opens the answer
    assert opening_for(USER + HEADER) == ANSWER_OPENING
    # not a turn's start, or a later turn that follows no tool response
    assert opening_for(SYSTEM + USER) == ""
    assert opening_for(SYSTEM + USER + HEADER + "hi<|im_end|>\n" + USER + HEADER) == ""


def test_the_environment_closes_the_answer_where_the_model_breaks_the_line():
    assert closed_answer(" Zeus\nThe supreme deity") == " Zeus</answer>"
    assert closed_answer(" Zeus </answer> more") == " Zeus </answer>"
    assert closed_answer(" Zeus") == " Zeus</answer>"
    assert closed_answer("\nZeus") == "</answer>"  # a turn that opens with a newline answers nothing


def test_the_environment_closes_the_call_where_the_model_closes_its_query():
    """`--close-query` (after run 9: its copied queries ran to the turn cap or carried one brace too many): the
    environment writes what is left of `"]}}\n</tool_call>` after the model's closing quote."""
    assert CALL_CLOSING == '"]}}\n</tool_call>'
    assert query_closing('Scottish economist"') == "]}}\n</tool_call>"
    assert query_closing('Scottish economist"]') == "}}\n</tool_call>"
    assert query_closing('Adam Smith?"]}}\n</tool_call>') == ""  # the model closed it all itself
    assert query_closing("Scottish economist") is None  # never closed: no call
    assert query_closing('Scottish", "economist"]') is None  # a second query: left as the model wrote it
    assert query_closing('"]}}}}') is None  # run 9's extra brace stays the model's error
    assert query_closing('say \\"hi\\" now"') == "]}}\n</tool_call>"  # an escaped quote is part of the query
    full = SEARCH_OPENING + 'Scottish economist"]' + query_closing('Scottish economist"]')
    body = json.loads(full.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body == {"name": "search", "arguments": {"query_list": ["Scottish economist"]}}


def test_the_eval_proxy_opens_and_closes_turns_as_training_does():
    import httpx
    from fastapi.testclient import TestClient

    from searchrl.trainer.proofs.search_proxy import proxy_app

    seen: list[dict[str, object]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        body = json.loads(request.content)
        seen.append(body)
        text = 'Zeus"]}}\n</tool_call>' if str(body["prompt"]).endswith(SEARCH_OPENING) else " Zeus\nmore"
        return httpx.Response(200, json={"choices": [{"text": text, "finish_reason": "stop"}]})

    client = TestClient(proxy_app("http://up", close_answer=True, transport=httpx.MockTransport(upstream)))
    assert client.get("/v1/models").json() == {"data": [{"id": "m"}]}
    first = client.post("/v1/completions", json={"prompt": SYSTEM + USER + HEADER, "max_tokens": 8}).json()
    assert first["choices"][0]["text"] == SEARCH_OPENING + 'Zeus"]}}\n</tool_call>'
    assert str(seen[-1]["prompt"]).endswith(SEARCH_OPENING) and "stop" not in seen[-1]
    answer = client.post("/v1/completions", json={"prompt": USER + HEADER, "stop": ["</x>"]}).json()
    assert answer["choices"][0]["text"] == "<answer> Zeus</answer>"
    assert seen[-1]["stop"] == ["</x>", "\n", "<"]
    assert client.get("/openings").json() == {"search": 1, "answer": 1, "none": 0}


def test_the_answer_cap_cuts_the_answer_turn_alone_in_training_and_in_eval(tmp_path, compose, monkeypatch):
    """`--answer-tokens` (run 11's answers held the title inside the passage's first sentence): the eval proxy caps
    the answer turn's max_tokens and leaves the query turn's alone; the training loop reads the same cap from the
    composed config; the run refuses a cap above the turn cap or without the environment closing the answer."""
    import httpx
    from fastapi.testclient import TestClient

    from searchrl.trainer.overrides import merge_overrides, render_overrides
    from searchrl.trainer.plugins.engine_kwargs import searchrl_engine_kwargs
    from searchrl.trainer.proofs import learn_search, search_eval
    from searchrl.trainer.proofs.harness import cpu_settings
    from searchrl.trainer.proofs.search_env import ANSWER_TOKENS_KEY, answer_budget
    from searchrl.trainer.proofs.search_proxy import proxy_app

    seen: list[dict[str, object]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": " Denver is", "finish_reason": "length"}]})

    client = TestClient(
        proxy_app("http://up", close_answer=True, transport=httpx.MockTransport(upstream), answer_tokens=4)
    )
    client.post("/v1/completions", json={"prompt": SYSTEM + USER + HEADER, "max_tokens": 96})
    assert seen[-1]["max_tokens"] == 96  # the query turn keeps the turn cap
    answer = client.post("/v1/completions", json={"prompt": USER + HEADER, "max_tokens": 96}).json()
    assert seen[-1]["max_tokens"] == 4 and answer["choices"][0]["text"] == "<answer> Denver is</answer>"
    assert answer_budget({"max_tokens": 2}, 4)["max_tokens"] == 2 and answer_budget({}, None) == {}

    settings = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:9")
    capped = learn_search.LearnSearchRun(tmp_path, tmp_path, format_weight=0.1, answer_tokens=6)
    extra = learn_search.search_overrides(settings, capped, 0, tmp_path / "d", tmp_path / "r")
    rollout = compose(merge_overrides(render_overrides(settings), extra)).actor_rollout_ref.rollout
    assert searchrl_engine_kwargs(rollout)[ANSWER_TOKENS_KEY] == 6
    uncapped = learn_search.LearnSearchRun(tmp_path, tmp_path, format_weight=0.1)
    plain = learn_search.search_overrides(settings, uncapped, 0, tmp_path / "d", tmp_path / "r")
    assert not any(ANSWER_TOKENS_KEY in o for o in plain)

    commands: list[list[str]] = []
    monkeypatch.setattr(search_eval, "_start", lambda cmd, *a, **k: commands.append(list(cmd)))
    monkeypatch.setattr(search_eval, "_wait", lambda *a, **k: None)
    monkeypatch.setattr(search_eval, "_stop", lambda proc: None)
    with search_eval.served_model(tmp_path, "m", "bfloat16", tmp_path, tmp_path, answer_tokens=6):
        pass
    proxy = next(c for c in commands if "searchrl.trainer.proofs.search_proxy" in c)
    assert proxy[proxy.index("--answer-tokens") + 1] == "6"

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for bad in (
        ["--answer-tokens", "97"],
        ["--answer-tokens", "-1"],
        ["--answer-tokens", "6", "--no-close-answer"],
    ):
        out = tmp_path / f"o{len(bad)}{bad[1]}"
        args = [
            "train",
            "learn-search",
            "--out",
            str(out),
            "--model",
            str(model),
            "--corpus",
            str(CORPUS),
            *bad,
        ]
        assert main(args) == 2
        assert not out.exists()


def test_the_eval_proxy_closes_the_query_after_trainings_stop_tokens():
    import httpx
    from fastapi.testclient import TestClient

    from searchrl.trainer.proofs.search_proxy import proxy_app

    seen: list[dict[str, object]] = []
    texts = iter(['Scottish economist"]', "Scottish economist and more"])

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": next(texts), "finish_reason": "stop"}]})

    client = TestClient(proxy_app("http://up", transport=httpx.MockTransport(upstream), query_stops=[7, 9]))
    body = {"prompt": SYSTEM + USER + HEADER, "stop": ["</tool_call>"]}
    closed = client.post("/v1/completions", json=body).json()["choices"][0]
    assert closed["text"] == SEARCH_OPENING + 'Scottish economist"]}}\n</tool_call>'
    assert closed["finish_reason"] == "stop" and closed["stop_reason"] is None
    assert seen[-1]["stop_token_ids"] == [7, 9] and seen[-1]["include_stop_str_in_output"] is True
    assert "stop" not in seen[-1]  # training's query turn has no stop string
    unclosed = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert unclosed == SEARCH_OPENING + "Scottish economist and more"  # no quote: no call, as in training


def test_the_eval_serves_the_run_with_its_own_answer_rule(tmp_path, monkeypatch):
    """Run 3 trained with `--close-answer` but its eval proxy was started without it: every answer ended
    `<answer> Beijing<|im_end|>`, parsed as no answer, EM 0 by construction. The run's rule reaches the proxy."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from searchrl.trainer.proofs import learn_search, search_eval

    commands: list[list[str]] = []
    monkeypatch.setattr(search_eval, "_start", lambda cmd, *a, **k: commands.append(list(cmd)))
    monkeypatch.setattr(search_eval, "_wait", lambda *a, **k: None)
    monkeypatch.setattr(search_eval, "_stop", lambda proc: None)
    for close in (True, False):
        commands.clear()
        with search_eval.served_model(tmp_path, "m", "bfloat16", tmp_path, tmp_path, close_answer=close):
            pass
        proxy = next(c for c in commands if "searchrl.trainer.proofs.search_proxy" in c)
        assert ("--close-answer" in proxy) is close
    commands.clear()
    with search_eval.served_model(tmp_path / "m", "m", "bfloat16", tmp_path, tmp_path, close_query=True):
        pass
    proxy = next(c for c in commands if "searchrl.trainer.proofs.search_proxy" in c)
    assert proxy[proxy.index("--close-query-tokenizer") + 1] == str(tmp_path / "m")

    served: list[bool] = []

    @contextmanager
    def fake_served(*args, close_answer=False, close_query=False, **kwargs):
        served.append((close_answer, close_query))
        yield "http://proxy/v1"

    monkeypatch.setattr(search_eval, "served_model", fake_served)
    monkeypatch.setattr(search_eval, "run_eval", lambda **kwargs: tmp_path / "r.json")
    for close in (True, False):
        run = learn_search.LearnSearchRun(
            out_dir=tmp_path, model_dir=tmp_path, close_answer=close, close_query=not close
        )
        leftovers = SimpleNamespace(scratch=tmp_path)
        learn_search._evaluate(
            run, "base", tmp_path, "http://r", {"held": tmp_path}, None, leftovers, search_off=True
        )
    assert served == [(True, False), (False, True)]


def test_the_answer_stops_are_every_token_that_breaks_the_line_or_opens_a_tag():
    pytest.importorskip("verl")
    model = REPO / "data" / "models" / "smollm2-135m"
    if not (model / "tokenizer.json").is_file():
        pytest.skip("make model-get makes the SmolLM2 folder")
    from transformers import AutoTokenizer

    from searchrl.trainer.proofs.search_env import answer_stop_ids, query_stop_ids

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = answer_stop_ids(tokenizer)
    assert tokenizer.encode("\n", add_special_tokens=False)[0] in ids
    assert all(any(s in tokenizer.decode([i]) for s in ("\n", "<")) for i in ids)
    assert tokenizer.encode(" Zeus", add_special_tokens=False)[0] not in ids
    query = query_stop_ids(tokenizer)
    assert {tokenizer.decode([i]) for i in query} >= {'"', '"]', '."', '?"'}
    assert not {'",', '\\"', " Zeus"} & {tokenizer.decode([i]) for i in query}


def test_the_training_loop_hands_the_parser_the_call_the_environment_closes():
    """The query turn stops after `"]` (query_stop_ids); verl's own hermes parser, given the opening, the model's
    ids and the environment's closing, reads one search call with the model's query."""
    pytest.importorskip("verl")
    model = REPO / "data" / "models" / "smollm2-135m"
    if not (model / "tokenizer.json").is_file():
        pytest.skip("make model-get makes the SmolLM2 folder")
    import asyncio

    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from searchrl.trainer.proofs.search_agent_loop import _OpenedParser

    tokenizer = AutoTokenizer.from_pretrained(model)
    hermes = ToolParser.get_tool_parser("hermes", tokenizer)
    opening = tokenizer.encode(SEARCH_OPENING, add_special_tokens=False)
    generated = tokenizer.encode('Scottish economist"]', add_special_tokens=False)
    closing = _OpenedParser(hermes, opening, tokenizer)
    _, calls = asyncio.run(closing.extract_tool_calls(generated, []))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("search", {"query_list": ["Scottish economist"]})
    ]
    assert tokenizer.decode(closing.closing) == "}}\n</tool_call>"
    plain = _OpenedParser(hermes, opening)  # without --close-query the model must close the call itself
    assert asyncio.run(plain.extract_tool_calls(generated, []))[1] == [] and plain.closing == []


def test_the_training_loop_opens_turns_by_the_same_rule():
    pytest.importorskip("verl")
    from searchrl.trainer.proofs.search_agent_loop import opening_of

    assert opening_of(0, "user") == SEARCH_OPENING
    assert opening_of(1, "tool") == ANSWER_OPENING
    assert opening_of(1, "assistant") == ""
    assert opening_of(0, "user", searching=False) == ANSWER_OPENING


# --- the verdict --------------------------------------------------------------------------------------------------


def arm(label: str, em: list[int], found: list[int] | None = None, searches: float = 1.0) -> Arm:
    return Arm(label, [float(x) for x in em], [bool(x) for x in (found or em)], [searches] * len(em))


N = 60


def ones(k: int, n: int = N) -> list[int]:
    return [1] * k + [0] * (n - k)


def test_a_gain_that_depends_on_search_is_learned_to_search():
    v = judge(
        arm("base on", ones(2), ones(30)),
        arm("trained on", ones(30), ones(50)),
        arm("base off", ones(0)),
        arm("trained off", ones(1)),
    )
    assert v.learned and v.line().startswith(VERDICT_OK)
    assert v.em.low > 0 and v.found.low > 0


def test_the_run_record_holds_the_held_out_table_and_the_verdict(tmp_path):
    """`<out>/run.json`: each arm's n, EM, answer retrieval and searches per episode, the paired differences, the
    steps' reward, and the verdict line as it failed (or "passed"), strict JSON (a NaN share is null)."""
    from searchrl.trainer.proofs.learn_search import LearnSearchRun
    from searchrl.trainer.proofs.record import read_record, write_record
    from searchrl.trainer.step_checks import COLUMNS, StepRow

    run = LearnSearchRun(out_dir=tmp_path, model_dir=tmp_path, format_term="retrieved+f1")
    run.arms = {
        "base, held, search on": arm("base on", ones(2), ones(30), searches=0.25),
        "trained, held, search on": arm("trained on", ones(2), ones(40)),
        "base, held, search off": arm("base off", ones(0)),
        "trained, held, search off": arm("trained off", ones(0)),
    }
    run.verdict = judge(*run.arms.values())
    run.rows = [StepRow(step, "1", {COLUMNS["reward"][1]: 0.1 * step}) for step in (1, 2)]
    write_record(tmp_path, "learn-search", None if run.verdict.learned else run.line(), run.figures())
    record = read_record(tmp_path)
    assert record["passed"] is False and record["verdict"].startswith("did NOT learn to search")
    figures = record["figures"]
    trained = figures["held_out"]["trained, held, search on"]
    assert trained == {
        "n": N,
        "em": pytest.approx(2 / N),
        "retrieved": pytest.approx(40 / N),
        "searches": 1.0,
        "f1": None,  # not measured by these arms: NaN, written as null
        "covers": None,
    }
    assert figures["held_out"]["base, held, search on"]["searches"] == 0.25
    assert figures["paired"]["retrieved"]["gained"] == 10 and figures["paired"]["em"]["diff"] == 0
    assert figures["paired"]["null"] is None and figures["format_share"] is None  # not run, not measured
    assert figures["step_reward"] == pytest.approx([0.1, 0.2]) and figures["format_term"] == "retrieved+f1"
    assert figures["written_query_would_retrieve"] == {}  # not measured
    assert "would put a golden answer" not in run.report()


def test_the_report_says_what_the_written_queries_would_have_retrieved(tmp_path):
    """Run 9: 0 of 60 trained searches ran, yet its queries would have found 57 of 60 answers; the report and
    run.json carry that measure per arm, and trained - base paired."""
    from searchrl.trainer.proofs.learn_search import LearnSearchRun
    from searchrl.trainer.proofs.record import read_record, write_record

    run = LearnSearchRun(out_dir=tmp_path, model_dir=tmp_path)
    run.written = {
        "base, held, search on": [bool(x) for x in ones(6)],
        "trained, held, search on": [bool(x) for x in ones(57)],
    }
    report = run.report()
    assert "- trained, held, search on: 57/60 [" in report and "- base, held, search on: 6/60 [" in report
    assert "trained - base, paired: +0.850 [" in report and "(+51/-0)" in report
    write_record(tmp_path, "learn-search", run.line(), run.figures())
    written = read_record(tmp_path)["figures"]["written_query_would_retrieve"]
    assert written["trained, held, search on"] == {"n": 60, "share": pytest.approx(0.95)}


def test_a_run_stopped_before_its_verdict_records_why(tmp_path, monkeypatch):
    """Run 4 stopped at its step check (`step 5: no search call`); its record must name that, not only "no
    verdict", and keep the phases it finished."""
    from searchrl.trainer.proofs import learn_search
    from searchrl.trainer.proofs.record import read_record

    def stop(run, *args):
        run.phases["base eval"] = 1.0
        raise SmokeCheckError("learn-search missed what training must show: step 5: no search call")

    monkeypatch.setattr(learn_search, "check_args", lambda *a, **k: None)
    monkeypatch.setattr(learn_search, "_run", stop)
    with pytest.raises(SmokeCheckError):
        learn_search.run_learn_search(tmp_path / "out", tmp_path, corpus=tmp_path / "c.jsonl")
    record = read_record(tmp_path / "out")
    assert record["passed"] is False
    assert record["verdict"] == (
        "did NOT learn to search: no verdict: learn-search missed what training must show: step 5: no search call"
    )
    assert record["figures"]["phases_s"] == {"base eval": 1.0}


def test_a_gain_that_survives_switching_search_off_is_not_search():
    v = judge(
        arm("base on", ones(2), ones(30)),
        arm("trained on", ones(30), ones(50)),
        arm("base off", ones(0)),
        arm("trained off", ones(25)),  # it learned the answers, not to search
    )
    assert not v.learned
    assert any("does not depend on search" in p for p in v.problems)
    assert "did NOT learn to search" in v.line()


def test_a_rise_within_noise_fails():
    v = judge(
        arm("base on", ones(5), ones(30)),
        arm("trained on", ones(8), ones(33)),  # +3 of 60: McNemar's interval spans zero
        arm("base off", ones(0)),
        arm("trained off", ones(0)),
    )
    assert not v.learned
    assert any("EM with search did not rise" in p for p in v.problems)
    assert any("answer retrieval" in p for p in v.problems)


def test_em_without_better_retrieval_fails():
    v = judge(
        arm("base on", ones(2), ones(55)),
        arm("trained on", ones(30), ones(55)),  # reads better, but its own search finds no more
        arm("base off", ones(0)),
        arm("trained off", ones(0)),
    )
    assert [p for p in v.problems if "answer retrieval" in p] and not v.learned


def test_the_null_must_be_beaten_when_it_ran():
    common = (arm("base on", ones(2), ones(30)), arm("trained on", ones(30), ones(50)))
    offs = (arm("base off", ones(0)), arm("trained off", ones(0)))
    assert not judge(*common, *offs, null_on=arm("null on", ones(29))).learned
    assert judge(*common, *offs, null_on=arm("null on", ones(3))).learned


def test_a_loss_is_not_learning():
    v = judge(
        arm("b", ones(30), ones(50)), arm("t", ones(2), ones(10)), arm("bo", ones(0)), arm("to", ones(0))
    )
    assert not v.learned and v.em.diff < 0 and v.em.high < 0


def test_paired_and_table_refuse_mismatched_questions_and_show_intervals():
    with pytest.raises(ConfigError):
        paired([1.0, 0.0], [1.0])
    with pytest.raises(ConfigError):
        judge(arm("a", ones(1, 10)), arm("b", ones(1, 11)), arm("c", ones(0, 10)), arm("d", ones(0, 10)))
    p = paired(ones(0, 20), ones(10, 20))
    assert (p.gained, p.lost, p.diff) == (10, 0, 0.5) and 0 < p.low < 0.5 <= p.high
    text = table([arm("base, held, search on", ones(3, 20))])
    assert "| base, held, search on | 20 | 0.150 [" in text


def test_arms_are_read_in_the_held_out_order_and_missing_questions_refused():
    records = {
        "q1": {"em": 1.0, "answer_in_observation": True, "searches": 1, "f1": 1.0, "answer": "Zeus",
               "golden_answers": ["Zeus"]},
        # the title inside a sentence: EM 0, F1 above 0, and it holds the answer
        "q2": {"em": 0.0, "searches": 0, "f1": 0.5, "answer": "The Renaissance is a period",
               "golden_answers": ["Renaissance"]},
    }  # fmt: skip
    a = Arm.from_records("x", records, ["q2", "q1"])
    assert a.em == [0.0, 1.0] and a.found == [False, True] and a.searches_mean() == 0.5
    assert a.f1_mean() == 0.75 and a.covers == [True, True]
    assert table([a]).splitlines()[-1].endswith("| 0.50 | 0.750 | 1.000 |")
    with pytest.raises(ConfigError, match="no record"):
        Arm.from_records("x", records, ["q3"])


# --- the CLI ------------------------------------------------------------------------------------------------------


def test_the_cli_refuses_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bundled_corpus: Path
):
    base = ["train", "learn-search", "--out", str(tmp_path / "o")]
    assert main([*base, "--model", str(tmp_path / "nowhere")]) == 2
    assert "no config.json" in capsys.readouterr().err
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main([*base, "--model", str(model), "--corpus", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*base, "--model", str(model), "--corpus", str(bundled_corpus), "--steps", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert main([*base, "--model", str(model), "--steps", "0"]) == 2  # the default, `bundled`, resolves to it
    assert "at least 1" in capsys.readouterr().err and bundled_corpus == CORPUS
    assert (
        main([*base, "--model", str(model), "--corpus", str(CORPUS), "--steps", "100", "--prompts", "8"]) == 2
    )
    assert "training rows" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_the_cli_leaves_the_recipe_to_the_library_and_can_turn_each_rule_off(tmp_path: Path, monkeypatch):
    """`make learn-search` with no flags runs the documented recipe (learn_search's FORMAT_TERM, STEPS, LR,
    TURN_TOKENS, CLOSE_ANSWER, CLOSE_QUERY: the CLI passes only what the user gave); `--no-close-query` reaches it."""
    import inspect
    from types import SimpleNamespace

    from searchrl.trainer.proofs import learn_search

    defaults = inspect.signature(learn_search.run_learn_search).parameters
    given: list[dict[str, object]] = []

    def fake(out, model, **kwargs):
        given.append(kwargs)
        return SimpleNamespace(report=lambda: "r", out_dir=tmp_path, verdict=None)

    monkeypatch.setattr(learn_search, "run_learn_search", fake)
    model = tmp_path / "m"
    model.mkdir()
    base = ["train", "learn-search", "--out", str(tmp_path / "o"), "--model", str(model)]
    assert main(base) == 2
    assert main([*base, "--no-close-query", "--close-answer", "--format-term", "searched"]) == 2
    recipe = {"format_term", "steps", "lr", "turn_tokens", "close_answer", "close_query", "answer_tokens"}
    assert not recipe & set(given[0])
    assert {k: given[1][k] for k in recipe & set(given[1])} == {
        "close_query": False,
        "close_answer": True,
        "format_term": "searched",
    }
    assert defaults["format_term"].default == learn_search.FORMAT_TERM == "written+f1"
    assert defaults["close_query"].default is defaults["close_answer"].default is True
    assert (defaults["steps"].default, defaults["lr"].default, defaults["turn_tokens"].default) == (
        8,
        1e-4,
        96,
    )
    # the answer cap (run 12) is the recipe's with the environment closing the answer, none without it
    assert defaults["answer_tokens"].default is None and learn_search.ANSWER_TOKENS == 4
    assert learn_search.answer_cap(None, True, 96) == 4 and learn_search.answer_cap(None, False, 96) is None
    assert learn_search.answer_cap(0, True, 96) is None and learn_search.answer_cap(8, True, 96) == 8


def test_the_make_target_runs_the_verb_from_the_vllm_venv():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "learn-search:" in makefile
    assert "$(VLLM_CPU_VENV)/bin/searchrl train learn-search" in makefile


def test_a_step_line_glued_to_verls_dump_message_is_still_read():
    """verl printed `Dumped generations to <dir>/3.jsonl` without a newline and run 2 of make learn-search lost step 3
    (its checks then failed the run: steps logged [1, 2, 4, 5, 6])."""
    from searchrl.trainer.step_checks import parse_steps

    text = "(TaskRunnerV1 pid=1) Dumped generations to /tmp/r/3.jsonlstep:3 - critic/score/mean:0.2 - x:1\n"
    rows = parse_steps(text + "step:4 - critic/score/mean:0.1\n", "run")
    assert [row.step for row in rows] == [3, 4]
    assert rows[0].metrics["critic/score/mean"] == 0.2


def test_the_reward_curve_draws_the_run_and_its_null(tmp_path):
    from searchrl.trainer.proofs.learn_search import LearnSearchRun, plot_rewards
    from searchrl.trainer.step_checks import COLUMNS, StepRow

    key = COLUMNS["reward"][1]
    run = LearnSearchRun(out_dir=tmp_path, model_dir=tmp_path)
    run.rows = [StepRow(step, "1", {key: 0.05 * step}) for step in range(1, 7)]
    run.null_rows = [StepRow(step, "null", {key: 0.04}) for step in range(1, 7)]
    path = plot_rewards(run, tmp_path / "figs" / "reward_curve.png")
    assert path.stat().st_size > 10_000  # the folder made, the figure written


def test_the_format_term_pays_a_search_or_only_a_search_that_found_the_answer():
    """`searched` pays any call that ran (run 2's `your query` met it); `retrieved` only a tool response holding a
    golden answer; EM keeps its weight in both, and the term's share is reported."""
    from searchrl.trainer.proofs.search_reward import compute_score, retrieved

    truth = {"target": ["The Seventh Seal"]}
    found = (
        '<tool_call>{"name": "search", "arguments": {"query_list": ["medieval knight chess death film"]}}'
        "</tool_call><tool_response>Doc 1(Title: The Seventh Seal) a 1957 film ...</tool_response>"
        "<answer>Ingmar Bergman</answer>"
    )
    junk = found.replace("The Seventh Seal) a 1957 film", "Your Query) a band from Ohio")
    ran = {"search_calls": 1, "search_failures": 0}
    assert retrieved(found, ["the seventh seal"]) == 1.0 and retrieved(junk, ["The Seventh Seal"]) == 0.0
    assert retrieved("The Seventh Seal outside any tool response", ["The Seventh Seal"]) == 0.0
    assert retrieved(found, ["Seventh"]) == 1.0 and retrieved(found, ["Sev"]) == 0.0  # whole words only
    for text in (found, junk):
        assert compute_score("x", text, truth, ran, format_weight=0.2)["score"] == pytest.approx(0.2)
    assert compute_score("x", found, truth, ran, format_weight=0.2, format_term="retrieved")["score"] == 0.2
    assert compute_score("x", junk, truth, ran, format_weight=0.2, format_term="retrieved")["score"] == 0.0
    right = found.replace("Ingmar Bergman", "The Seventh Seal")
    scored = compute_score("x", right, truth, ran, format_weight=0.2, format_term="retrieved")
    assert scored["score"] == pytest.approx(1.2) and scored["format_share"] == pytest.approx(0.2 / 1.2)
    with pytest.raises(ValueError, match="format_term"):
        compute_score("x", found, truth, ran, format_weight=0.2, format_term="length")


def test_the_f1_term_pays_half_for_the_search_and_half_for_the_golden_words_in_the_answer():
    """`retrieved+f1` (run 4): a search that found the passage earns half the term; the answer earns the other
    half in proportion to its token F1, so "Beijing" earns nothing and a partial title earns part of it."""
    import argparse

    from searchrl.cli.learn_search import register
    from searchrl.trainer.proofs.search_reward import FORMAT_TERMS, compute_score

    truth = {"target": ["The Seventh Seal"]}
    ran = {"search_calls": 1, "search_failures": 0}
    found = "<tool_response>Doc 1(Title: The Seventh Seal) a 1957 film</tool_response>"

    def term(text: str) -> float:
        return compute_score("x", text, truth, ran, format_weight=0.2, format_term="retrieved+f1")["score"]

    assert term(found + "<answer> Beijing </answer>") == pytest.approx(0.1)
    # EM drops "the": "Seventh" is half the golden words (P 1, R 1/2, F1 2/3)
    assert term(found + "<answer> Seventh </answer>") == pytest.approx(0.1 + 0.1 * 2 / 3)
    assert term(found + "<answer> The Seventh Seal </answer>") == pytest.approx(1.2)  # EM + the whole term
    assert term("<tool_response>nothing</tool_response><answer> Seventh </answer>") == pytest.approx(
        0.1 * 2 / 3
    )
    assert term(found) == pytest.approx(0.1)  # no answer: F1 0
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    choices = next(
        a.choices
        for sub in parser._subparsers._group_actions
        for p in sub.choices.values()  # type: ignore[union-attr]
        for a in p._actions
        if a.dest == "format_term"
    )
    assert tuple(choices) == FORMAT_TERMS


def test_the_runs_agent_loop_keys_compose_in_the_searchrl_block(tmp_path, compose):
    """The turn cap, the declared answer closing and the scripted first turn (off) are our agent loops' keys
    (trainer/plugins/engine_kwargs.py): the run writes them into `engine_kwargs.searchrl`, verl composes them, and
    the loops read them back from the composed config."""
    from searchrl.trainer.overrides import merge_overrides, render_overrides
    from searchrl.trainer.plugins.agent_loop import turn_max_tokens
    from searchrl.trainer.plugins.engine_kwargs import searchrl_engine_kwargs
    from searchrl.trainer.proofs.harness import cpu_settings
    from searchrl.trainer.proofs.learn_search import TURN_TOKENS, LearnSearchRun, search_overrides
    from searchrl.trainer.proofs.search_env import CLOSE_ANSWER_KEY, CLOSE_QUERY_KEY

    settings = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:9")
    closing = LearnSearchRun(tmp_path, tmp_path, format_weight=0.1, close_answer=True, close_query=True)
    extra = search_overrides(settings, closing, 0, tmp_path / "dumps", tmp_path / "ray")
    config = compose(merge_overrides(render_overrides(settings), extra))
    rollout = config.actor_rollout_ref.rollout
    assert turn_max_tokens(rollout) == TURN_TOKENS
    # Adam without momentum and without decay (ADAM_BETA1): a step with no gradient moves nothing
    assert list(config.actor_rollout_ref.actor.optim.betas) == [0.0, 0.999]
    assert config.actor_rollout_ref.actor.optim.weight_decay == 0.0
    momentum = LearnSearchRun(tmp_path, tmp_path, format_weight=0.1, adam_beta1=0.9, turn_tokens=96)
    verl_default = search_overrides(settings, momentum, 0, tmp_path / "d", tmp_path / "r")
    composed = compose(merge_overrides(render_overrides(settings), verl_default)).actor_rollout_ref
    assert list(composed.actor.optim.betas) == [0.9, 0.999] and composed.actor.optim.weight_decay == 0.01
    assert turn_max_tokens(composed.rollout) == 96  # --turn-tokens (run 9: run 8's copied queries all hit 48)
    assert searchrl_engine_kwargs(rollout) == {
        "scripted_first_turn": False,
        "turn_max_tokens": TURN_TOKENS,
        CLOSE_ANSWER_KEY: True,
        CLOSE_QUERY_KEY: True,
    }


def test_the_query_term_pays_the_share_of_the_questions_words_its_first_query_holds():
    """`query+f1` (run 6): half the share of the question's content words (stop words and question words out) in
    the first parsed call's queries, half the answer's F1; a call that does not parse, or the prompt's `your
    query`, earns no query half; the term needs the question from extra_info."""
    from searchrl.trainer.proofs.search_reward import compute_score, content_words, query_overlap

    question = "Which subject is described as: '___ was a Scottish economist and philosopher.'?"
    assert content_words(question) == {"subject", "described", "scottish", "economist", "philosopher"}

    def call(*queries: str) -> str:
        args = json.dumps({"name": "search", "arguments": {"query_list": list(queries)}})
        return f"<tool_call>\n{args}\n</tool_call>"

    assert query_overlap(call("Scottish economist"), question) == pytest.approx(2 / 5)
    assert query_overlap(call("scottish", "PHILOSOPHER economist!"), question) == pytest.approx(3 / 5)
    assert query_overlap(call("your query"), question) == 0.0
    assert query_overlap(call("Scottish economist")[:-5], question) == 0.0  # unclosed: no call parsed
    assert query_overlap('<tool_call>{"name": "search", "arguments": ["x"]}</tool_call>', question) == 0.0
    # the first call counts, not a later one that copies the question
    assert query_overlap(call("your query") + call(question), question) == 0.0
    truth = {"target": ["Adam Smith"]}
    info = {"question": question, "search_calls": 1, "search_failures": 0}
    text = call("Scottish economist") + "<answer>Adam</answer>"
    scored = compute_score("x", text, truth, info, format_weight=0.2, format_term="query+f1")
    assert scored["score"] == pytest.approx(0.2 * (2 / 5 + 2 / 3) / 2) and scored["format_share"] == 1.0
    right = compute_score("x", call(question) + "<answer>Adam Smith</answer>", truth, info, 0.2, "query+f1")
    assert right["score"] == pytest.approx(1.2) and right["em"] == 1.0
    with pytest.raises(ValueError, match="question"):
        compute_score("x", text, truth, {"search_calls": 1}, format_weight=0.2, format_term="query+f1")


def test_the_written_query_counts_whether_or_not_the_call_then_parsed():
    """`query+searched+f1` (run 6's second recipe): a third for the query written after the environment's opening,
    read to its closing quote even when the JSON then breaks (run 6's first step: 22 of 32 calls did not parse), a
    third for a call that ran, a third for the answer's F1."""
    from searchrl.trainer.proofs.search_reward import compute_score, written_query_overlap

    question = "Which subject is described as: '___ was a Scottish economist and philosopher.'?"
    broken = SEARCH_OPENING + "Scottish economist\"]}}}'</tool_call>"
    assert written_query_overlap(broken, question) == pytest.approx(2 / 5)
    assert written_query_overlap(
        SEARCH_OPENING + "scottish philosopher economist", question
    ) == pytest.approx(3 / 5)
    assert written_query_overlap(SEARCH_OPENING + 'your query"]}}', question) == 0.0
    assert written_query_overlap("<answer> Adam Smith", question) == 0.0  # search off: no opening
    truth = {"target": ["Adam Smith"]}
    ran = {"question": question, "search_calls": 1, "search_failures": 0}
    failed = {"question": question, "search_calls": 1, "search_failures": 1}
    text = broken + "<answer>Adam</answer>"
    term = "query+searched+f1"
    assert compute_score("x", text, truth, ran, 0.3, term)["score"] == pytest.approx(
        0.1 * (2 / 5 + 1 + 2 / 3)
    )
    assert compute_score("x", text, truth, failed, 0.3, term)["score"] == pytest.approx(0.1 * (2 / 5 + 2 / 3))


def test_the_written_term_pays_a_call_only_for_the_questions_words_in_it():
    """`written+f1` (run 8): run 7's policy closed every call as `your query` by step 3 (a call that ran was a third
    of its term); here a call earns only the question's words it holds, in full when it ran and half when not."""
    from searchrl.trainer.proofs.search_reward import compute_score

    question = "Which subject is described as: '___ was a Scottish economist and philosopher.'?"
    truth = {"target": ["Adam Smith"]}
    ran = {"question": question, "search_calls": 1, "search_failures": 0}
    not_ran = {"question": question, "search_calls": 0, "search_failures": 0}

    def score(query: str, info: dict[str, object], answer: str = "") -> float:
        text = (
            SEARCH_OPENING + query + '"]}}\n</tool_call>' + (f"<answer>{answer}</answer>" if answer else "")
        )
        return compute_score("x", text, truth, info, 0.2, "written+f1")["score"]

    assert score("your query", ran) == 0.0  # closed, ran, and pays nothing
    assert score("Scottish economist", ran) == pytest.approx(0.2 * (2 / 5) / 2)
    assert score("Scottish economist", not_ran) == pytest.approx(0.2 * (2 / 5) / 4)
    assert score("your query", ran, "Adam") == pytest.approx(0.2 * (2 / 3) / 2)
    assert score("Scottish economist philosopher", ran, "Adam Smith") == pytest.approx(
        1 + 0.2 * (3 / 5 + 1) / 2
    )


def test_a_policy_that_stops_searching_is_measured_not_a_broken_run():
    """Runs 4 and 5 stopped at `step 5: no search call` and were never evaluated; a search call is now asked of step
    1 only (the base model: the tool is wired), and the other checks (every step once, failed searches, the bound)
    stay on every step."""
    from searchrl.trainer.proofs.learn_search import training_problems
    from searchrl.trainer.step_checks import StepRow, parse_steps
    from tests.trainer.proofs.test_train_cpu import STEP_LINE  # every figure verl logs, as it logs them

    def row(step: int, calls: float, failures: float = 0.0) -> StepRow:
        line = STEP_LINE.replace("step:2 ", f"step:{step} ").replace(
            "search/calls:4.0", f"search/calls:{calls}"
        )
        (parsed,) = parse_steps(
            line.replace("search/failures:0.0", f"search/failures:{failures}"), "learn-search"
        )
        return parsed

    assert training_problems([row(1, 9), row(2, 0), row(3, 0)], "float32", 3) == []
    assert training_problems([row(1, 0), row(2, 4)], "float32", 2) == [
        "step 1: no search call (the base model's calls ran in 9-10 of 32 trajectories before)"
    ]
    assert training_problems([row(1, 9), row(2, 3, failures=1)], "float32", 2) == [
        "step 2: 1 failed searches"
    ]
    assert training_problems([row(1, 9)], "float32", 2) == ["steps logged [1], expected 1..2 once each"]
