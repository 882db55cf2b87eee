"""The `search-r1` prompt format: a released Search-R1 checkpoint's protocol, against the live BM25 service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.cli import main
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
    "Ming and Qing": ["<answer> 24 </answer>"],
    "fractal": ["<answer> Mandelbrot </answer>"],
    "Charles Babbage": ["<answer> Analytical Engine </answer>"],
}


def test_search_r1_text_pieces() -> None:
    p = build_user_prompt("who wrote hamlet", prompt_format="search-r1")
    assert p.startswith("Answer the given question. You must conduct reasoning inside <think> and </think>")
    assert (
        "you can call a search engine by <search> query </search>" in p and "as many times as your want" in p
    )
    assert p.endswith("For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n")
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
    first = next(
        r for r in requests if "game of chess" in r["prompt"] and "</information>\n\n" not in r["prompt"]
    )
    assert "<tools>" not in first["prompt"] and first["stop"] == ["</search>"]
    assert build_user_prompt(q["q003"]["question"], prompt_format="search-r1") in first["prompt"]
    second = next(
        r for r in requests if "game of chess" in r["prompt"] and "</information>\n\n" in r["prompt"]
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
