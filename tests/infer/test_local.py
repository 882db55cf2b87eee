"""The local transformers engine end to end on a tiny randomly initialised Qwen2 built offline."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from verl.utils.reward_score import search_r1_like_qa_em as verl_em

from searchrl.cli import main
from searchrl.infer.agent import AgentConfig, SearchAgent, run_questions
from searchrl.infer.engine import open_engine
from searchrl.infer.llm import ChatRenderer, Sampling
from searchrl.infer.local import LocalLLM
from searchrl.infer.settings import InferSettings
from searchrl.prompt import build_messages
from searchrl.rollout import RolloutSpec, training_tool_schemas
from tests.conftest import TINY_QA

QUESTION = "Who directed The Seventh Seal?"


def test_local_completion_is_greedy_generate_on_the_rendered_prompt(tiny_model_dir: Path) -> None:
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    renderer = ChatRenderer(llm.tokenizer)
    prompt = renderer.initial(build_messages(QUESTION), training_tool_schemas())
    out = asyncio.run(llm.complete(prompt, Sampling(max_tokens=12)))
    assert out.finish_reason in ("stop", "length") and 0 < out.completion_tokens <= 12

    # the same thing by hand: the prompt the agent renders, greedy, up to EOS
    tok = llm.tokenizer
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert out.prompt_tokens == ids.shape[1]
    with torch.inference_mode():
        ref = llm.model.generate(
            ids,
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    new = ref[0, ids.shape[1] :].tolist()
    if new and new[-1] == tok.eos_token_id:
        new = new[:-1]
    assert out.text == tok.decode(new, skip_special_tokens=True)

    again = asyncio.run(llm.complete(prompt, Sampling(max_tokens=12)))
    assert again == out  # greedy is deterministic


def test_local_agent_runs_an_episode(tiny_model_dir: Path) -> None:
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    agent = SearchAgent(
        llm,
        None,
        AgentConfig(search=False, rollout=RolloutSpec(max_tokens_per_turn=8)),
        ChatRenderer(llm.tokenizer),
    )
    ep = asyncio.run(agent.run(QUESTION))
    assert ep.turns == 1 and ep.searches == 0 and 0 < ep.completion_tokens <= 8
    assert ep.response.startswith(ep.transcript[-1]["content"])


def test_the_bar_shows_tokens_and_tokens_per_s_while_a_question_is_still_running(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local CPU eval sat at 0/3 for 10 minutes (issue 39): the bar counted questions only."""
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu", threads=1)
    agent = SearchAgent(
        llm,
        None,
        AgentConfig(search=False, rollout=RolloutSpec(max_tokens_per_turn=300)),
        ChatRenderer(llm.tokenizer),
    )
    (ep,) = asyncio.run(run_questions(agent, [QUESTION], concurrency=1, refresh_s=0.02))
    assert ep.completion_tokens > 100, "the random model ran on"
    # the bar's frames while the question was still at 0/1 carry a growing token count and a rate
    shown = [
        int(n.replace(",", ""))
        for n in re.findall(r"0/1 \[[^\]]*?, ([\d,]+) tokens, \d+\.\d tok/s\]", capsys.readouterr().err)
    ]
    assert shown and max(shown) > 0 and shown == sorted(shown)
    assert max(shown) <= ep.completion_tokens + 1  # + the EOS a row may end with
    # the live count is the tokens generate() made, counted per step: it adds up to the engine's total
    assert llm.tokens_generated() == llm.stats.generated_tokens >= ep.completion_tokens


def test_a_local_cpu_eval_says_its_turn_budget_and_how_to_cap_it(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SmolLM2 rambles to the 4,096-token budget: the run says so before the first question, and the flag."""
    caplog.set_level(logging.INFO, logger="searchrl.infer.engine")
    for extra, says in [
        ({}, "up to 4,096 tokens (what is left of --max-response-tokens 4096; no --max-tokens-per-turn)"),
        ({"max_tokens_per_turn": 64}, "up to 64 tokens (--max-tokens-per-turn 64)"),
    ]:
        caplog.clear()
        settings = InferSettings(
            engine="local", model=str(tiny_model_dir), device="cpu", search=False, **extra
        )
        llm, _ = asyncio.run(open_engine(settings))
        asyncio.run(llm.aclose())
        (line,) = [r.getMessage() for r in caplog.records if "local engine on CPU" in r.getMessage()]
        assert says in line and "cap it with --max-tokens-per-turn N" in line


@pytest.mark.live
def test_searchrl_eval_local_engine(tiny_model_dir: Path, live_bm25_url: str, tmp_path: Path) -> None:
    rc = main(
        [
            "eval",
            "--engine", "local",
            "--model", str(tiny_model_dir),
            "--device", "cpu",
            "--retrieval-url", live_bm25_url,
            "--qa", str(TINY_QA),
            "--limit", "2",
            "--max-tokens-per-turn", "16",
            "--output-dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert rc == 0
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["protocol"]["endpoint"] == "local:cpu" and doc["protocol"]["engine"] == "local"
    assert doc["protocol"]["retrieval"]["backend"] == "bm25"
    assert len(doc["questions"]) == 2
    for q in doc["questions"]:
        assert q["turns"] >= 1 and q["completion_tokens"] <= 16 * q["turns"]
        assert q["em"] == verl_em.compute_score(q["response"], {"target": q["golden_answers"]})


def _prompts(llm: LocalLLM, n: int) -> list[str]:
    renderer = ChatRenderer(llm.tokenizer)
    questions = [QUESTION, "Who wrote Hamlet?", "What is the capital of Sweden?", "When did the war end?"]
    return [renderer.initial(build_messages(questions[i % 4] + " " * (i // 4)), None) for i in range(n)]


async def _together(llm: LocalLLM, prompts: list[str], samplings: list[Sampling]) -> list:
    return list(await asyncio.gather(*[llm.complete(p, s) for p, s in zip(prompts, samplings, strict=True)]))


def test_concurrent_requests_run_as_one_left_padded_batch(tiny_model_dir: Path) -> None:
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    prompts = _prompts(llm, 4)  # different lengths: the batch is left-padded
    assert len({llm.tokenizer(p)["input_ids"].__len__() for p in prompts}) > 1
    caps = [12, 3, 12, 7]  # each row stops at its own max_tokens
    batched = asyncio.run(_together(llm, prompts, [Sampling(max_tokens=c) for c in caps]))
    assert llm.stats.batches == 1 and llm.stats.sequences == 4
    alone = [llm._generate(p, Sampling(max_tokens=c)) for p, c in zip(prompts, caps, strict=True)]
    assert llm.stats.as_dict()["batch_sizes"] == {"1": 4, "4": 1}
    for b, a, cap in zip(batched, alone, caps, strict=True):
        assert b.completion_tokens <= cap and b.prompt_tokens == a.prompt_tokens
        assert b.text == a.text and b.finish_reason == a.finish_reason  # padding changes nothing (greedy)
        assert b.model_s > 0
    stats = llm.stats.as_dict()
    assert stats["generated_tokens"] > 0 and stats["tokens_per_s"] > 0


def test_requests_with_other_sampling_settings_get_their_own_batch(tiny_model_dir: Path) -> None:
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    prompts = _prompts(llm, 3)
    samplings = [Sampling(max_tokens=4), Sampling(max_tokens=4, stop=("x",)), Sampling(max_tokens=5)]
    asyncio.run(_together(llm, prompts, samplings))
    assert llm.stats.as_dict()["batch_sizes"] == {"1": 1, "2": 1}


def test_generation_stops_at_a_stop_string_instead_of_running_on(tiny_model_dir: Path) -> None:
    """The old engine generated to max_tokens and cut the text after the fact (27% of SmolLM2's tokens wasted)."""
    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    (prompt,) = _prompts(llm, 1)
    free = llm._generate(prompt, Sampling(max_tokens=40))
    ids = llm.tokenizer(free.text, add_special_tokens=False)["input_ids"]
    assert free.completion_tokens >= 20 and free.finish_reason == "length", "the random model ran on"
    # the text of the first 3 generated tokens as the stop string: it completes at the 3rd token
    stop = llm.tokenizer.decode(ids[:3])
    assert stop and free.text.startswith(stop)
    cut = llm._generate(prompt, Sampling(max_tokens=40, stop=(stop,)))
    assert cut.finish_reason == "stop" and cut.matched_stop == stop and cut.text == ""
    assert cut.completion_tokens <= 3 < free.completion_tokens  # nothing generated after the stop


def test_model_bench_compares_one_at_a_time_with_batched(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "model",
        "bench",
        str(tiny_model_dir),
        "--concurrency",
        "1,4",
        "--questions",
        "4",
        "--max-tokens",
        "4",
    ]
    assert main(args) == 0
    rows = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert [r.split("|")[1:3] for r in rows[1:]] == [[" 1 ", " 1.0 "], [" 4 ", " 4.0 "]]
