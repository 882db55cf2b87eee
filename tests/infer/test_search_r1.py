"""The `search-r1` prompt format: a released Search-R1 checkpoint's protocol, against the live BM25 service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.infer.llm import ChatRenderer
from searchrl.prompt import (
    SEARCH_R1_INVALID,
    SEARCH_R1_PROMPT_VERSION,
    build_user_prompt,
    cut_search_r1_turn,
    format_search_r1_observation,
    parse_search_r1_action,
)
from tests.conftest import TINY_QA
from tests.infer.conftest import serve_scripts

MODEL = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-3b-em-grpo"
# Turns the way Search-R1 checkpoints write them: think, then <search>, later <answer>.
SCRIPTS = {
    "game of chess": [
        "<think>I need the film.</think>\n<search> 1957 film knight plays chess with Death </search>\n<information>"
        "the model may ramble past the stop",
        "<think>It is The Seventh Seal by Ingmar Bergman.</think>\n<answer> Ingmar Bergman </answer> trailing",
    ],
    "Shlomo Yitzchaki": ["<think>no tags here, an invalid action</think>", "<answer> Rashi </answer>"],
    # an empty query: Search-R1 searches it and shows what comes back; never a search failure
    "Ming and Qing": ["<think>search</think><search> </search>", "<answer> 24 </answer>"],
    # an unclosed <search> that ends at EOS (the server reports no stop string): not a search, an invalid action
    "fractal": ["<search> Mandelbrot set", "<answer> Mandelbrot </answer>"],
    "Charles Babbage": ["<answer> Analytical Engine </answer>"],
}


def test_search_r1_text_pieces() -> None:
    p = build_user_prompt("who wrote hamlet", prompt_format="search-r1")
    assert p.startswith("Answer the given question. You must conduct reasoning inside <think> and </think>")
    assert (
        "you can call a search engine by <search> query </search>" in p and "as many times as your want" in p
    )
    assert p.endswith("For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n")
    # Search-R1's make_prefix appends "?" to any question not ending in one; our own format spares "." and "!"
    assert build_user_prompt("Name the river.", prompt_format="search-r1").endswith(
        "Question: Name the river.?\n"
    )
    assert build_user_prompt("Name the river!", prompt_format="search-r1").endswith("river!?\n")
    assert build_user_prompt("Name the river.").endswith("Question: Name the river.\n")
    assert parse_search_r1_action("x <search> a b </search> <answer>c</answer>") == ("search", "a b")
    assert parse_search_r1_action("<answer> 24 </answer>") == ("answer", "24")
    assert parse_search_r1_action("nothing") == (None, "")
    assert cut_search_r1_turn("a <search>q</search> more") == "a <search>q</search>"
    obs = format_search_r1_observation(['"Rashi"\nRashi was a rabbi.', '"Troyes"\nA city.'])
    assert (
        obs
        == '\n\n<information>Doc 1(Title: "Rashi") Rashi was a rabbi.\nDoc 2(Title: "Troyes") A city.</information>\n\n'
    )


@pytest.mark.live
def test_eval_a_search_r1_checkpoint_as_it_is(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path
) -> None:
    for llm_url, app in serve_scripts({MODEL: SCRIPTS}):
        rc = main(
            [
                "eval", "--model", MODEL, "--tokenizer", str(chat_tokenizer_dir), "--llm-url", llm_url,
                "--retrieval-url", live_bm25_url, "--qa", str(TINY_QA), "--datasets", "dev",
                "--prompt-format", "search-r1", "--output-dir", str(tmp_path),
            ]
        )  # fmt: skip
        requests = app.state.requests
    assert rc == 0
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["protocol"]["prompt_format"] == "search-r1"
    assert doc["protocol"]["prompt_version"] == SEARCH_R1_PROMPT_VERSION
    assert doc["protocol"]["rollout"]["prompt_format"] == "search-r1"
    q = {r["id"]: r for r in doc["questions"]}
    assert (q["q003"]["em"], q["q003"]["searches"], q["q003"]["turns"]) == (1.0, 1, 2)
    assert q["q003"]["queries"] == ["1957 film knight plays chess with Death"]
    assert (q["q013"]["em"], q["q013"]["malformed_calls"]) == (1.0, 1)
    # the empty query is model behaviour: no failure, an empty <information>, the run stays valid
    assert q["q008"]["model_errors"] == {"empty_query": 1} and q["q008"]["search_failures"] == 0
    assert q["q008"]["transcript"][2]["content"] == "\n\n<information></information>\n\n"
    assert doc["summary"]["valid"] and doc["summary"]["model_errors"]["empty_query"] == 1
    # EOS after "<search> Mandelbrot set" is not a stop at </search>: no search, Search-R1's invalid action
    assert (q["q018"]["searches"], q["q018"]["malformed_calls"], q["q018"]["em"]) == (0, 1, 1.0)
    first = next(
        r for r in requests if "game of chess" in r["prompt"] and "\n\n<information>" not in r["prompt"]
    )
    assert "<tools>" not in first["prompt"] and first["stop"] == ["</search>"]
    # Search-R1's evaluation preset: 500 new tokens per turn; pinned decoding on every request
    assert first["max_tokens"] == 500 and doc["protocol"]["max_tokens_per_turn"] == 500
    assert all((r["repetition_penalty"], r["top_k"], r["min_p"]) == (1.0, -1, 0.0) for r in requests)
    assert doc["protocol"]["max_observation_tokens"] == 500
    renderer = ChatRenderer.from_pretrained(str(chat_tokenizer_dir))
    obs = q["q003"]["transcript"][2]["content"]
    assert obs.startswith("\n\n<information>Doc 1") and 490 <= renderer.count(obs) <= 500  # cut at 500 tokens
    assert build_user_prompt(q["q003"]["question"], prompt_format="search-r1") in first["prompt"]
    second = next(
        r for r in requests if "game of chess" in r["prompt"] and "\n\n<information>" in r["prompt"]
    )
    # one assistant turn: the action, then the results spliced in, Search-R1's way
    assert (
        '</search>\n\n<information>Doc 1(Title: "The Seventh Seal") The Seventh Seal is' in second["prompt"]
    )
    assert second["prompt"].count("<|im_start|>assistant") == 1
    assert "ramble past the stop" not in second["prompt"]
    assert q["q003"]["response"].endswith("<answer> Ingmar Bergman </answer><|im_end|>")
    retry = next(r for r in requests if "Shlomo" in r["prompt"] and "try again." in r["prompt"])
    assert retry["prompt"].endswith("an invalid action</think>" + SEARCH_R1_INVALID)
