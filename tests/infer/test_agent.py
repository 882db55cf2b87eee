"""The agent loop against a scripted OpenAI-compatible server and the live BM25 retrieval service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from searchrl.infer.agent import (
    STOP_MALFORMED,
    STOP_MAX_TURNS,
    STOP_NO_TOOL_CALL,
    AgentConfig,
    Episode,
    SearchAgent,
    run_questions,
)
from searchrl.infer.llm import ChatRenderer, Sampling, ServerLLM
from searchrl.prompt import build_messages
from searchrl.retrieval.client import RetrievalClient
from searchrl.rollout import RolloutSpec, training_tool_schemas
from tests.conftest import TINY_QA
from tests.infer.conftest import serve_scripts

pytestmark = pytest.mark.live

MODEL = "scripted-trained"


def call(*queries: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "search", "arguments": {"query_list": list(queries)}})
        + "\n</tool_call>"
    )


# Keys are substrings of the tiny_qa questions; values are the assistant turns the "model" produces.
TRAINED = {
    "game of chess": [
        "<think>I need the director of the film.</think>\n" + call("1957 film knight plays chess with Death"),
        "<think>The Seventh Seal was written and directed by Ingmar Bergman.</think>\n<answer> Ingmar Bergman </answer>",
    ],
    "Ming and Qing": [
        "<think>First find the palace.</think>\n" + call("imperial palace complex Beijing"),
        "<think>It is the Forbidden City; how many emperors lived there?</think>\n"
        + call("Forbidden City residence of Ming and Qing emperors"),
        "<think>24 emperors.</think>\n<answer>24</answer>",
    ],
    "Shlomo Yitzchaki": ["<think>I know this one.</think>\n<answer> Rashi </answer>"],
    # missing closing brace: not JSON, so verl's hermes parser would drop it and end the episode
    "fractal": [
        '<think>Search.</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["fractal"]}\n</tool_call>'
    ],
    # keeps searching forever
    "Charles Babbage": [
        call("Charles Babbage mechanical computer"),
        call("first computer programmer"),
        call("Ada Lovelace"),
        call("analytical engine"),
    ],
}


def questions() -> dict[str, dict]:
    rows = [json.loads(line) for line in TINY_QA.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[str, object]]:
    yield from serve_scripts({MODEL: TRAINED})


def run_all(
    llm_url: str, retrieval_url: str, renderer: ChatRenderer | None, config: AgentConfig, qs: list[str]
) -> list[Episode]:
    async def go() -> list[Episode]:
        async with ServerLLM(llm_url, MODEL) as llm, RetrievalClient([retrieval_url]) as rc:
            agent = SearchAgent(llm, rc, config, renderer)
            return await run_questions(agent, qs, concurrency=4, progress=False)

    return asyncio.run(go())


def test_five_behaviours_against_live_retrieval(
    scripted, live_bm25_url: str, chat_renderer: ChatRenderer
) -> None:
    qa = questions()
    ids = ["q003", "q008", "q013", "q018", "q023"]
    eps = dict(
        zip(
            ids,
            run_all(
                scripted[0],
                live_bm25_url,
                chat_renderer,
                AgentConfig(rollout=RolloutSpec(max_turns=2)),
                [qa[i]["question"] for i in ids],
            ),
            strict=True,
        )
    )

    one = eps["q003"]  # answered after one search
    assert (one.searches, one.turns, one.stop_reason) == (1, 2, STOP_NO_TOOL_CALL)
    assert one.queries == ["1957 film knight plays chess with Death"]
    tool_msgs = [m for m in one.transcript if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "(Title: The Seventh Seal)" in tool_msgs[0]["content"]
    assert one.response.rstrip().endswith("<answer> Ingmar Bergman </answer><|im_end|>")

    two = eps["q008"]  # two searches
    assert (two.searches, two.turns, two.stop_reason) == (2, 3, STOP_NO_TOOL_CALL)
    assert any("(Title: Forbidden City)" in m["content"] for m in two.transcript if m["role"] == "tool")

    none = eps["q013"]  # no search
    assert (none.searches, none.turns, none.stop_reason) == (0, 1, STOP_NO_TOOL_CALL)

    bad = eps["q018"]  # malformed tool call ends the episode, as in training
    assert (bad.searches, bad.turns, bad.stop_reason, bad.malformed_calls) == (0, 1, STOP_MALFORMED, 1)
    assert "<answer>" not in bad.response

    loop = eps["q023"]  # still calling tools at max_turns: the last turn's call is not run
    assert (loop.searches, loop.turns, loop.stop_reason) == (2, 3, STOP_MAX_TURNS)
    assert loop.queries == ["Charles Babbage mechanical computer", "first computer programmer"]


def test_prompt_is_the_training_token_stream(
    scripted, live_bm25_url: str, chat_renderer: ChatRenderer
) -> None:
    """The second-turn prompt equals what verl's Qwen continuous-token builder produces in training."""
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

    _, app = scripted
    question = questions()["q003"]["question"]
    app.state.requests.clear()
    (ep,) = run_all(
        scripted[0], live_bm25_url, chat_renderer, AgentConfig(rollout=RolloutSpec(max_turns=2)), [question]
    )
    prompts = [r["prompt"] for r in app.state.requests]
    assert len(prompts) == 2

    tok = chat_renderer.tokenizer
    builder = QwenContinuousTokenBuilder(tok)
    messages = build_messages(question)
    ids = builder.build_initial_tokens(messages, tools=training_tool_schemas())
    assert tok.decode(ids) == prompts[0]
    turn1 = ep.transcript[1]["content"]
    ids = builder.merge_assistant_tokens(
        ids, tok.encode(turn1, add_special_tokens=False) + [tok.eos_token_id]
    ).token_ids
    before = [*messages, {"role": "assistant", "content": turn1}]
    after = [*before, {"role": "tool", "content": ep.transcript[2]["content"]}]
    ids = builder.merge_context_tokens(before, after, ids, tools=training_tool_schemas()).token_ids
    assert tok.decode(ids) == prompts[1]


def test_malformed_feedback_shows_the_error(
    scripted, live_bm25_url: str, chat_renderer: ChatRenderer
) -> None:
    question = questions()["q018"]["question"]
    (ep,) = run_all(
        scripted[0],
        live_bm25_url,
        chat_renderer,
        AgentConfig(rollout=RolloutSpec(max_turns=1), malformed_feedback=True),
        [question],
    )
    assert ep.stop_reason == STOP_MAX_TURNS and ep.turns == 2 and ep.malformed_calls == 2
    tool = [m["content"] for m in ep.transcript if m["role"] == "tool"]
    assert len(tool) == 1 and tool[0].startswith("tool call is not valid JSON")


def test_no_search_baseline_has_no_tools(scripted, live_bm25_url: str, chat_renderer: ChatRenderer) -> None:
    _, app = scripted
    app.state.requests.clear()
    question = questions()["q003"]["question"]
    (ep,) = run_all(scripted[0], live_bm25_url, chat_renderer, AgentConfig(search=False), [question])
    assert ep.turns == 1 and ep.searches == 0
    assert (
        "# Tools" not in app.state.requests[0]["prompt"]
        and "search tool" not in app.state.requests[0]["prompt"]
    )


def test_chat_mode_with_server_side_tool_parser(scripted, live_bm25_url: str) -> None:
    _, app = scripted
    app.state.requests.clear()
    qa = questions()
    eps = run_all(
        scripted[0],
        live_bm25_url,
        None,
        AgentConfig(api="chat", rollout=RolloutSpec(max_turns=2)),
        [qa["q003"]["question"], qa["q008"]["question"]],
    )
    assert [(e.searches, e.turns) for e in eps] == [(1, 2), (2, 3)]
    assert "<answer> Ingmar Bergman </answer>" in eps[0].response
    second = next(r for r in app.state.requests if len(r["messages"]) == 3)
    assert second["tools"] == training_tool_schemas()
    roles = [m["role"] for m in second["messages"]]
    assert roles[:3] == ["user", "assistant", "tool"]
    # OpenAI's spec: a tool call has an id and string arguments; the tool message answers it by tool_call_id
    (tc,) = second["messages"][1]["tool_calls"]
    assert tc["function"]["name"] == "search" and tc["type"] == "function"
    assert isinstance(tc["function"]["arguments"], str)
    assert list(json.loads(tc["function"]["arguments"])) == ["query_list"]
    assert tc["id"] and second["messages"][2]["tool_call_id"] == tc["id"]


def test_unknown_tool_and_retrieval_failure_become_observations(
    chat_renderer: ChatRenderer, tmp_path: Path
) -> None:
    scripts = {
        MODEL: {
            "game of chess": [
                '<tool_call>\n{"name": "browse", "arguments": {"url": "x"}}\n</tool_call>',
                '<tool_call>\n{"name": "search", "arguments": {"query_list": [" "]}}\n</tool_call>',
                call("Seventh Seal"),
                "<answer>Bergman</answer>",
            ]
        }
    }
    dead = "http://127.0.0.1:9"  # discard port: connection refused

    async def go(url: str) -> Episode:
        async with ServerLLM(url, MODEL) as llm, RetrievalClient([dead], max_retries=0, timeout_s=1.0) as rc:
            config = AgentConfig(rollout=RolloutSpec(max_turns=4), sampling=Sampling(max_tokens=50))
            return await SearchAgent(llm, rc, config, chat_renderer).run(questions()["q003"]["question"])

    for url, _ in serve_scripts(scripts):
        ep = asyncio.run(go(url))
    tool = [m["content"] for m in ep.transcript if m["role"] == "tool"]
    # the texts verl's loop (unknown name) and the trainer's tool (bad arguments, dead service) produce
    assert tool[0] == "Unknown function 'browse'. Available tools: ['search']"
    assert (
        tool[1] == 'search failed: bad arguments: search needs at least one non-empty string in "query_list"'
    )
    assert tool[2] == "search failed: connect"
    assert (ep.search_failures, ep.searches, ep.turns, ep.stop_reason) == (1, 2, 4, STOP_NO_TOOL_CALL)
    # the unknown name and the empty query are the model's doing: model behaviour, not service failures
    assert ep.failure_kinds == {"connect": 1}
    assert ep.model_errors == {"unknown_tool": 1, "bad_arguments": 1}


def test_observations_match_the_trainers_tool(
    scripted, live_bm25_url: str, chat_renderer: ChatRenderer
) -> None:
    """With default settings on both sides, the eval loop shows the model what the training tool showed it."""
    from searchrl.infer.settings import InferSettings
    from searchrl.trainer.plugins.tool import SearchTool
    from searchrl.trainer.settings import TrainSettings
    from searchrl.trainer.toolconfig import render_tool_config

    tool_cfg = render_tool_config(TrainSettings(retrieval_urls=[live_bm25_url]))["tools"][0]["config"]
    tool = SearchTool(tool_cfg)
    query = "1957 film knight plays chess with Death"

    async def train_side() -> str:
        instance, _ = await tool.create()
        response, _, _ = await tool.execute(instance, {"query_list": [query]})
        await tool.aclose()
        return str(response.text)

    config = AgentConfig.from_settings(InferSettings(retrieval_url=live_bm25_url, max_turns=2))
    (ep,) = run_all(scripted[0], live_bm25_url, chat_renderer, config, [questions()["q003"]["question"]])
    assert ep.queries == [query]
    assert ep.transcript[2]["content"] == asyncio.run(train_side())
