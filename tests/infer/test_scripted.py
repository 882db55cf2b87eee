"""The scripted model `searchrl smoke` runs `searchrl eval` against: OpenAI wire format, deterministic policy."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from searchrl.infer.scripted import PIPELINE_CHECK_MODEL, SearchThenAnswer, create_scripted_app
from searchrl.prompt import build_messages, format_observation, parse_tool_calls, queries_from_arguments

QUESTION = "Who directed The Seventh Seal?"


def _client() -> TestClient:
    return TestClient(create_scripted_app(SearchThenAnswer()))


def test_chat_searches_for_the_question_then_answers_with_the_first_title() -> None:
    client = _client()
    assert client.get("/v1/models").json()["data"][0]["id"] == PIPELINE_CHECK_MODEL
    messages = build_messages(QUESTION, search=True)
    body = {"model": PIPELINE_CHECK_MODEL, "messages": messages, "tools": [{"type": "function"}]}
    first = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert first["finish_reason"] == "tool_calls"
    (call,) = first["message"]["tool_calls"]
    assert call["function"]["name"] == "search"
    assert queries_from_arguments(json.loads(call["function"]["arguments"])) == [QUESTION]

    observation = format_observation(
        [QUESTION], [['"Ingmar Bergman (director)"\nErnst Ingmar Bergman was a Swedish director.', '"B"\nb']]
    )
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": observation, "tool_call_id": call["id"]},
    ]
    second = client.post("/v1/chat/completions", json={**body, "messages": messages}).json()["choices"][0]
    assert second["finish_reason"] == "stop" and second["message"]["tool_calls"] == []
    assert "<answer> Ingmar Bergman (director) </answer>" in second["message"]["content"]


def test_completions_reads_the_rendered_prompt_and_says_when_nothing_was_found() -> None:
    client = _client()
    prompt = (
        "<|im_start|>user\n" + build_messages(QUESTION, search=True)[-1]["content"] + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    body = {"model": PIPELINE_CHECK_MODEL, "prompt": prompt, "max_tokens": 500}
    text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert parse_tool_calls(text).calls[0].arguments == {"query_list": [QUESTION]}
    prompt += (
        text + "<|im_end|>\n<|im_start|>user\n<tool_response>\nsearch returned no results\n</tool_response>"
    )
    prompt += "<|im_end|>\n<|im_start|>assistant\n"
    text = client.post("/v1/completions", json={**body, "prompt": prompt}).json()["choices"][0]["text"]
    assert text.endswith("<answer> no passage </answer>")


def test_unknown_model_gets_vllms_404() -> None:
    resp = _client().post("/v1/chat/completions", json={"model": "gpt-x", "messages": []})
    assert resp.status_code == 404 and resp.json()["message"] == "The model `gpt-x` does not exist."
