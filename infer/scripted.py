"""A scripted OpenAI-compatible model server: a PIPELINE CHECK, never a model result.

    python -m searchrl.infer.scripted --host 127.0.0.1 --port 30000     # serves "searchrl-pipeline-check"

It speaks the wire format `searchrl eval` uses with sglang and vLLM (`GET /health`, `GET /v1/models`,
`POST /v1/completions`, `POST /v1/chat/completions` with hermes tool calls parsed into `tool_calls` as a server
started with `--tool-call-parser hermes` does, vLLM's error shape), so everything between the model and the
result file runs for real: prompt, tool call parsing, the retrieval client against a live service, observation
formatting, answer parsing, scoring, the report. `searchrl smoke` starts it to check a served index end to end
without a GPU.

Two policies decide what it says:

- `SearchThenAnswer` (the one the CLI serves): turn 1 searches for the question, as written after
  "Question:"; turn 2 answers with the title of the first passage it read (`Doc 1 (Title: T)`), or says it
  found nothing. No knowledge, no randomness: on a QA set whose answers are supporting titles its EM is the
  index's recall@1, which is what makes it a check of the pipeline and not of any model.
- `Replay` (tests): fixed turns per model, picked by a key found in the question's turn.

Every request body is kept in `app.state.requests`; `app.state.fail_after = N` makes every generation request
after the first N answer 503, as a server that died mid-run. `app.state.model_roots = {model: path}` makes
`/v1/models` report the path as `root` (vLLM/sglang name the weights' path there); `app.state.reject_fields`
makes a request carrying one of those fields answer 400 naming it, as OpenAI's API does for `top_k`. A
completion cut at a stop string reports it in `stop_reason`, as vLLM does (None for EOS or length).
"""

from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchrl.prompt import TOOL_NAME

PIPELINE_CHECK_MODEL = "searchrl-pipeline-check"
ASSISTANT_HEADER = "<|im_start|>assistant\n"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_FIRST_TITLE_RE = re.compile(r"Doc 1 \(Title: (.+?)\) ")
_QUESTION_RE = re.compile(r"Question:\s*(.+?)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Turn:
    """What a policy sees of a conversation, whichever endpoint it came through."""

    question_turn: str  # the first user turn (the prompt with the question)
    turn: int  # assistant turns already in the conversation
    observation: str | None  # the latest tool response, if any


class Policy(Protocol):
    """Decides the next assistant text; None answers 400 (no scripted completion)."""

    models: Sequence[str]

    def reply(self, model: str, turn: Turn) -> str | None: ...


@dataclass
class Replay:
    """Fixed turns: `{model: {question key: [turn 1, turn 2, ...]}}`; the last turn repeats."""

    scripts: dict[str, dict[str, list[str]]]
    models: Sequence[str] = field(init=False)

    def __post_init__(self) -> None:
        self.models = list(self.scripts)

    def reply(self, model: str, turn: Turn) -> str | None:
        for key, turns in self.scripts.get(model, {}).items():
            if key in turn.question_turn:
                return turns[min(turn.turn, len(turns) - 1)]
        return None


@dataclass
class SearchThenAnswer:
    """Search for the question, then answer with the first passage's title (module docstring)."""

    models: Sequence[str] = (PIPELINE_CHECK_MODEL,)

    def reply(self, model: str, turn: Turn) -> str | None:
        if model not in self.models:
            return None
        if turn.observation is None:
            match = _QUESTION_RE.search(turn.question_turn)
            question = match.group(1) if match else turn.question_turn.strip()
            call = json.dumps(
                {"name": TOOL_NAME, "arguments": {"query_list": [question]}}, ensure_ascii=False
            )
            return (
                f"<think>pipeline check: search for the question</think>\n<tool_call>\n{call}\n</tool_call>"
            )
        found = _FIRST_TITLE_RE.search(turn.observation)
        answer = found.group(1) if found else "no passage"
        return f"<think>pipeline check: answer with the first passage's title</think>\n<answer> {answer} </answer>"


def _error(status: int, message: str) -> JSONResponse:
    # vLLM's error shape
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequestError", "code": status}, status
    )


def _first_user_turn(prompt: str) -> str:
    """The question's turn only: observations later in the prompt may mention other scripts' keys."""
    start = prompt.find("<|im_start|>user\n")
    end = prompt.find("<|im_end|>", start)
    return prompt[start:end] if start >= 0 and end > start else prompt


def _last_observation(prompt: str) -> str | None:
    """The latest tool response in a rendered prompt: hermes `<tool_response>` or Search-R1 `<information>`.

    Only after the question's turn: the instructions themselves name both tags.
    """
    question = _first_user_turn(prompt)
    start = prompt.find(question) + len(question) if question in prompt else 0
    prompt = prompt[start:]
    blocks = _TOOL_RESPONSE_RE.findall(prompt) or re.findall(
        r"\n\n<information>(.*?)(?:</information>|\Z)", prompt, re.DOTALL
    )
    return blocks[-1] if blocks else None


def _usage(prompt: str, completion: str) -> dict[str, int]:
    p, c = len(prompt.split()), len(completion.split())
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _completion(
    prefix: str, kind: str, model: str, choice: dict[str, Any], usage: dict[str, int]
) -> JSONResponse:
    """The OpenAI response envelope both endpoints share (one choice)."""
    body = {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    return JSONResponse(body)


def _parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """What sglang/vLLM's hermes tool parser returns: OpenAI tool calls with string arguments."""
    calls = []
    for raw in _TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))},
            }
        )
    return calls


def _refusal(app: FastAPI, policy: Policy, body: dict[str, Any]) -> JSONResponse | None:
    """What both endpoints check first, as vLLM/sglang do: draining, unknown arguments, unknown model.

    Every body is kept in `app.state.requests` first, so the tests see refused requests too.
    """
    state = app.state
    state.requests.append(body)
    if state.fail_after is not None and len(state.requests) > state.fail_after:
        return _error(503, "server is shutting down")
    rejected = sorted(state.reject_fields & body.keys())
    if rejected:
        return _error(400, f"Unrecognized request argument supplied: {rejected[0]}")
    if body.get("model") not in policy.models:
        return _error(404, f"The model `{body.get('model')}` does not exist.")
    return None


def _prompt_turn(prompt: str) -> int:
    """Assistant turns so far in a rendered prompt, counted the way Search-R1's format continues them.

    Search-R1 continues one assistant turn after each <information> (counted by its opening: an observation cut
    to max_obs_length tokens may have lost its closing tag) and after each "try again." retry message.
    """
    return (
        prompt.count(ASSISTANT_HEADER) - 1 + prompt.count("\n\n<information>") + prompt.count("try again.\n")
    )


def _cut(text: str, stop: Sequence[str], max_tokens: int) -> tuple[str, str, str | None]:
    """(text, finish_reason, stop_reason) after the request's stop strings and token budget, as vLLM reports them.

    A "token" is a space-separated word here; a cut at the budget reports "length" and no stop string.
    """
    finish, matched = "stop", None
    for s in stop:
        if s in text:
            text, matched = text[: text.index(s)], s
    words = text.split(" ")
    if len(words) > max_tokens:
        text, finish, matched = " ".join(words[:max_tokens]), "length", None
    return text, finish, matched


def _text_completion(policy: Policy, body: dict[str, Any]) -> JSONResponse:
    """`POST /v1/completions` once the request was accepted: the policy's reply to a rendered prompt."""
    model: str = body["model"]  # _refusal let only a model the policy serves through
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return _error(400, "prompt must be a string")
    text = policy.reply(
        model, Turn(_first_user_turn(prompt), _prompt_turn(prompt), _last_observation(prompt))
    )
    if text is None:
        return _error(400, "no scripted completion for this prompt")
    text, finish, matched = _cut(text, body.get("stop") or [], int(body.get("max_tokens") or 16))
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": matched,
        "prompt_logprobs": None,
    }
    return _completion("cmpl", "text_completion", model, choice, _usage(prompt, text))


def _chat_turn(messages: Sequence[dict[str, Any]]) -> Turn:
    """What the policy sees of a chat: the first user message, assistant turns so far, the latest tool result."""
    first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tool_messages = [m for m in messages if m.get("role") == "tool"]
    observation = str(tool_messages[-1].get("content") or "") if tool_messages else None
    return Turn(first_user, turn, observation)


def _chat_completion(policy: Policy, body: dict[str, Any]) -> JSONResponse:
    """`POST /v1/chat/completions` once the request was accepted: the policy's reply, tool calls parsed."""
    model: str = body["model"]  # _refusal let only a model the policy serves through
    messages = body.get("messages") or []
    text = policy.reply(model, _chat_turn(messages))
    if text is None:
        return _error(400, "no scripted completion for these messages")
    # A server started with a hermes tool parser returns parsed tool calls and strips them from content.
    tool_calls = _parse_tool_calls(text) if body.get("tools") else []
    content = _TOOL_CALL_RE.sub("", text).strip() if tool_calls else text
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": None,
        "tool_calls": tool_calls,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "stop_reason": None,
    }
    return _completion("chatcmpl", "chat.completion", model, choice, _usage(json.dumps(messages), text))


def create_scripted_app(policy: Policy) -> FastAPI:
    """The OpenAI-compatible app around `policy` (see the module docstring for the endpoints)."""
    app = FastAPI(title="scripted model (pipeline check)")
    app.state.requests = []
    app.state.fail_after = None
    app.state.model_roots = {}
    app.state.reject_fields = set()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in policy.models
        ]
        for d in data:
            if d["id"] in app.state.model_roots:
                d["root"] = app.state.model_roots[d["id"]]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        refusal = _refusal(app, policy, body)
        return refusal if refusal is not None else _text_completion(policy, body)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        refusal = _refusal(app, policy, body)
        return refusal if refusal is not None else _chat_completion(policy, body)

    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve `SearchThenAnswer` on a loopback port until killed."""
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m searchrl.infer.scripted", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args = parser.parse_args(argv)
    uvicorn.run(create_scripted_app(SearchThenAnswer()), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()


__all__ = [
    "PIPELINE_CHECK_MODEL",
    "Policy",
    "Replay",
    "SearchThenAnswer",
    "Turn",
    "create_scripted_app",
    "main",
]
