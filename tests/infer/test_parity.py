"""Byte parity with training: one trajectory through the training agent loop and through `infer`, same token ids.

Training side: verl 0.9.1's ToolAgentLoop as every run uses it (`searchrl_tool_agent`, trainer/plugins/agent_loop.py, no
scripted turn), built from our composed config and tool YAML, with a scripted
token server (the one fake: no GPU here), searching the live BM25 service through our SearchTool.
Eval side: infer's SearchAgent with the same scripted replies as text, the same tokenizer and the same live
service, configured from InferSettings defaults, which come from the shared searchrl/rollout.py.
The scripted first turn asks for two searches: training runs only the first (max_parallel_calls=1), so must eval.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from searchrl.infer.agent import STOP_NO_TOOL_CALL, STOP_RESPONSE_BUDGET, AgentConfig, SearchAgent
from searchrl.infer.llm import ChatRenderer, Completion, Sampling
from searchrl.infer.settings import InferSettings
from searchrl.prompt import SEARCH_TOOL_SCHEMA, build_messages
from searchrl.retrieval.client import RetrievalClient
from searchrl.rollout import TRAINING_TOOL_SCHEMA, training_tool_schemas, verl_rendered_schema
from searchrl.trainer.data import prepare_data
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.toolconfig import write_tool_config
from tests.trainer.conftest import (
    SCRIPTED_TEXTS,
    SEVENTH_SEAL_QUESTION,
    compose,
    offline_tokenizer,
)
from tests.trainer.plugins.test_agent_loop import _dataset_row, _run_loop, _settings

# fixtures re-used from the trainer tests (qa_sample is tests/conftest.py's, seen everywhere)
__all__ = ["compose", "offline_tokenizer"]

pytestmark = [pytest.mark.live, pytest.mark.slow]

THINK_SEARCH, THINK_ANSWER, RIGHT, _ = SCRIPTED_TEXTS


def _call(query: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "search", "arguments": {"query_list": [query]}})
        + "\n</tool_call>"
    )


# Two calls in one turn: the second must not run on either side.
REPLIES = [
    f"{THINK_SEARCH}\n{_call(SEVENTH_SEAL_QUESTION)}\n{_call('Akira Kurosawa')}",
    f"{THINK_ANSWER}\n{RIGHT}",
]


def _multi_call(*queries: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "search", "arguments": {"query_list": list(queries)}})
        + "\n</tool_call>"
    )


class ScriptedText:
    """infer's TextGenerator with the replies verl's scripted server returns as token ids."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.max_tokens: list[int] = []
        self.prompts: list[str] = []

    async def complete(self, prompt: str, sampling: Sampling) -> Completion:
        self.max_tokens.append(sampling.max_tokens)
        self.prompts.append(prompt)
        return Completion(text=self.replies.pop(0), finish_reason="stop")

    async def aclose(self) -> None:
        return None


def _infer_ids(
    tok: Any, url: str, settings: InferSettings, replies: list[str] = REPLIES
) -> tuple[list[int], Any, ScriptedText]:
    renderer = ChatRenderer(tok)
    llm = ScriptedText(replies)

    async def go() -> Any:
        async with RetrievalClient([url]) as rc:
            return await SearchAgent(llm, rc, AgentConfig.from_settings(settings), renderer).run(
                SEVENTH_SEAL_QUESTION
            )

    ep = asyncio.run(go())
    # the prompt the agent itself sent first (system block with the tool schema), then the whole response
    assert llm.prompts[0] == renderer.initial(build_messages(SEVENTH_SEAL_QUESTION), training_tool_schemas())
    return tok.encode(llm.prompts[0] + ep.response, add_special_tokens=False), ep, llm


def _verl(
    tmp_path: Path,
    qa: Path,
    url: str,
    tok: Any,
    compose_fn: Any,
    replies: list[str] = REPLIES,
    **train_kw: Any,
) -> tuple[Any, list]:
    settings = _settings(tmp_path, qa, url)
    settings = settings.model_copy(update=train_kw)
    prepare_data(settings)
    write_tool_config(settings)
    cfg = compose_fn(render_overrides(settings))
    row = _dataset_row(settings, cfg, tok, tmp_path)
    calls: list[dict] = []
    output, _ = asyncio.run(_run_loop(cfg, tok, row, list(replies), calls))
    return output, calls


def test_pinned_schema_is_verls_rendering() -> None:
    rendered = verl_rendered_schema(SEARCH_TOOL_SCHEMA)
    assert rendered == TRAINING_TOOL_SCHEMA == training_tool_schemas()[0]
    assert "items" not in json.dumps(rendered)  # what the model saw in training has no `items`


def test_trajectory_token_ids_match_verl(
    tmp_path: Path, live_bm25_url: str, offline_tokenizer: Any, compose: Any, qa_sample: Path
) -> None:
    tok = offline_tokenizer
    output, calls = _verl(tmp_path, qa_sample, live_bm25_url, tok, compose)
    assert calls == [{"query_list": [SEVENTH_SEAL_QUESTION]}]  # only the first of the two calls ran
    verl_ids = list(output.prompt_ids) + list(output.response_ids)

    ids, ep, llm = _infer_ids(tok, live_bm25_url, InferSettings(retrieval_url=live_bm25_url))
    assert (
        ep.queries == [SEVENTH_SEAL_QUESTION]
        and ep.dropped_calls == 1
        and ep.stop_reason == STOP_NO_TOOL_CALL
    )
    assert ids[: len(output.prompt_ids)] == list(output.prompt_ids)  # the system prompt and tool schema
    assert ids == verl_ids  # the whole trajectory, observation included
    assert ep.response_tokens == len(output.response_ids)
    # the turn budget is training's: what is left of prompt + response, capped at the response length
    assert llm.max_tokens[0] == 4096 and llm.max_tokens[1] == 4096


def test_response_budget_cuts_where_verl_cuts(
    tmp_path: Path, live_bm25_url: str, offline_tokenizer: Any, compose: Any, qa_sample: Path
) -> None:
    """A response budget smaller than turn 1 + observation: verl drops the observation and stops; so does eval."""
    tok = offline_tokenizer
    output, _ = _verl(tmp_path, qa_sample, live_bm25_url, tok, compose, max_response_length=128)
    ids, ep, _ = _infer_ids(
        tok, live_bm25_url, InferSettings(retrieval_url=live_bm25_url, max_response_tokens=128)
    )
    assert ep.stop_reason == STOP_RESPONSE_BUDGET and ep.turns == 1
    assert ids == list(output.prompt_ids) + list(output.response_ids)


def test_overlong_observation_is_cut_as_verl_cuts_it(
    tmp_path: Path, live_bm25_url: str, offline_tokenizer: Any, compose: Any, qa_sample: Path
) -> None:
    """Four queries in one call: more passages than the observation budget. The tool caps its text at the
    budget, marker included, so verl does not cut it a second time ("...(truncated)"), and eval reads the same."""
    tok = offline_tokenizer
    replies = [
        f"{THINK_SEARCH}\n"
        + _multi_call(
            SEVENTH_SEAL_QUESTION, "Forbidden City emperors", "Rashi commentator", "fractal Mandelbrot"
        ),
        f"{THINK_ANSWER}\n{RIGHT}",
    ]
    output, _ = _verl(tmp_path, qa_sample, live_bm25_url, tok, compose, replies)
    ids, ep, _ = _infer_ids(tok, live_bm25_url, InferSettings(retrieval_url=live_bm25_url), replies)
    observation = ep.transcript[2]["content"]
    limit = InferSettings(retrieval_url=live_bm25_url).rollout.observation_chars
    assert len(observation) == limit and observation.endswith("...")
    assert "(truncated)" not in observation
    assert ids == list(output.prompt_ids) + list(output.response_ids)
