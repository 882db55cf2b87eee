"""A scripted OpenAI-compatible server (the GPU LLM is the one part that cannot run here).

It speaks the real wire format of vLLM/sglang for `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions`, and replays fixed assistant turns: each model has a script
`{question_key: [turn 1 text, turn 2 text, ...]}`; the script is picked by the key found in the prompt and the
turn by how many assistant turns the prompt already holds. Every request body is kept in `app.state.requests`
so tests can check the exact prompt the agent sent. Setting `app.state.fail_after = N` makes every generation
request after the first N answer 503, as a server that died mid-run (vLLM's error shape).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ASSISTANT_HEADER = "<|im_start|>assistant\n"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

Scripts = dict[str, dict[str, list[str]]]  # model -> question key -> turns


def _error(status: int, message: str) -> JSONResponse:
    # vLLM's error shape
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequestError", "code": status}, status
    )


def _pick(scripts: Scripts, model: str, text: str, turn: int) -> str | None:
    for key, turns in scripts.get(model, {}).items():
        if key in text:
            return turns[min(turn, len(turns) - 1)]
    return None


def _first_user_turn(prompt: str) -> str:
    """The question's turn only: observations later in the prompt may mention other scripts' keys."""
    start = prompt.find("<|im_start|>user\n")
    end = prompt.find("<|im_end|>", start)
    return prompt[start:end] if start >= 0 and end > start else prompt


def _usage(prompt: str, completion: str) -> dict[str, int]:
    p, c = len(prompt.split()), len(completion.split())
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def create_scripted_app(scripts: Scripts) -> FastAPI:
    app = FastAPI()
    app.state.requests = []
    app.state.fail_after = None

    def _down() -> bool:
        return app.state.fail_after is not None and len(app.state.requests) > app.state.fail_after

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in scripts],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        app.state.requests.append(body)
        if _down():
            return _error(503, "server is shutting down")
        model, prompt = body.get("model"), body.get("prompt")
        if model not in scripts:
            return _error(404, f"The model `{model}` does not exist.")
        if not isinstance(prompt, str):
            return _error(400, "prompt must be a string")
        # assistant turns so far; Search-R1's format continues one assistant turn after each <information>
        turn = (
            prompt.count(ASSISTANT_HEADER)
            - 1
            + prompt.count("</information>\n\n")
            + prompt.count("try again.\n")
        )
        text = _pick(scripts, model, _first_user_turn(prompt), turn)
        if text is None:
            return _error(400, "no scripted completion for this prompt")
        finish = "stop"
        if "stop" in body and body["stop"]:
            for s in body["stop"]:
                if s in text:
                    text = text[: text.index(s)]
        max_tokens = int(body.get("max_tokens") or 16)
        words = text.split(" ")
        if len(words) > max_tokens:
            text, finish = " ".join(words[:max_tokens]), "length"
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": _usage(prompt, text),
            }
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        app.state.requests.append(body)
        model, messages = body.get("model"), body.get("messages") or []
        if model not in scripts:
            return _error(404, f"The model `{model}` does not exist.")
        first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        text = _pick(scripts, model, first_user, turn)
        if text is None:
            return _error(400, "no scripted completion for these messages")
        # A server started with a hermes tool parser returns parsed tool calls and strips them from content.
        tool_calls = []
        if body.get("tools"):
            for raw in _TOOL_CALL_RE.findall(text):
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                tool_calls.append(
                    {
                        "id": f"call_{uuid.uuid4().hex[:8]}",
                        "type": "function",
                        "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))},
                    }
                )
        content = _TOOL_CALL_RE.sub("", text).strip() if tool_calls else text
        message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": None}
        message["tool_calls"] = tool_calls
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                        "stop_reason": None,
                    }
                ],
                "usage": _usage(json.dumps(messages), text),
            }
        )

    return app
