"""The local transformers engine end to end on a tiny randomly initialised Qwen2 built offline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from verl.utils.reward_score import search_r1_like_qa_em as verl_em

from searchrl.cli import main
from searchrl.infer.agent import AgentConfig, SearchAgent
from searchrl.infer.llm import ChatRenderer, Sampling
from searchrl.infer.local import LocalLLM
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
