"""The eval side of `make learn-search`'s declared environment: an OpenAI-compatible proxy that opens turns.

`proxy_app` sits in front of a served model (vLLM's OpenAI server) and applies trainer/proofs/search_env.py's
`opening_for` to every `/v1/completions` prompt: the opening is appended to the prompt, the completion comes back
as the opening plus the continuation, so `searchrl eval` sees the turn training's agent loop builds. Every other
route is forwarded unchanged. No `from __future__ import annotations` here: FastAPI reads the handlers'
annotations at run time.
"""

import argparse
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from searchrl.trainer.proofs.search_env import (
    ANSWER_OPENING,
    ANSWER_STOPS,
    SEARCH_OPENING,
    answer_budget,
    closed_answer,
    opening_for,
    query_closing,
)


def proxy_app(
    upstream: str,
    close_answer: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    query_stops: list[int] | None = None,
    answer_tokens: int | None = None,
) -> Any:
    """An OpenAI-compatible app in front of `upstream` (a vLLM server's root URL, without /v1) that applies
    `opening_for` to every `/v1/completions` prompt; every other route is forwarded as it is. `transport`: the
    upstream's (tests pass httpx.MockTransport). `query_stops`: the model's `search_env.query_stop_ids` when the
    environment closes the query (`close_query`): the query turn stops after the same token as in training (vLLM's
    `stop_token_ids`, the token's text kept), and the proxy appends `query_closing`. `answer_tokens`: the answer turn's
    token cap (search_env.answer_budget), as training's."""
    app = FastAPI()
    client = httpx.AsyncClient(
        base_url=upstream.rstrip("/"), timeout=httpx.Timeout(600.0), transport=transport
    )
    app.state.openings = {"search": 0, "answer": 0, "none": 0}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        prompt = body.get("prompt")
        opening = opening_for(prompt) if isinstance(prompt, str) else ""
        kind = "none" if not opening else ("search" if opening == SEARCH_OPENING else "answer")
        app.state.openings[kind] += 1
        closing = close_answer and opening == ANSWER_OPENING
        closing_query = bool(query_stops) and opening == SEARCH_OPENING
        if opening:
            body["prompt"] = prompt + opening
        if opening == ANSWER_OPENING:
            body = answer_budget(body, answer_tokens)
        if closing:
            body["stop"] = [*(body.get("stop") or []), *ANSWER_STOPS]
        if closing_query:
            # training's query turn has no stop string (eval's `</tool_call>` would end it before the quote)
            body.pop("stop", None)
            body["stop_token_ids"] = [*(body.get("stop_token_ids") or []), *(query_stops or [])]
            body["include_stop_str_in_output"] = True
        reply = await client.post("/v1/completions", json=body)
        if reply.status_code != 200 or not opening:
            return Response(reply.content, reply.status_code, media_type="application/json")
        payload = reply.json()
        for choice in payload.get("choices", []):
            text = str(choice.get("text") or "")
            if closing:
                text = closed_answer(text)
                choice["finish_reason"], choice["stop_reason"] = "stop", None
            if closing_query and (call_end := query_closing(text)) is not None:
                text += call_end
                choice["finish_reason"], choice["stop_reason"] = "stop", None
            choice["text"] = opening + text
        return JSONResponse(payload)

    @app.get("/openings")
    async def openings() -> dict[str, int]:
        return dict(app.state.openings)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        url = f"/{path}"
        if request.method == "GET":
            reply = await client.get(url)
        else:
            body = await request.body()
            reply = await client.post(url, content=body, headers={"content-type": "application/json"})
        return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type"))

    return app


def main(argv: list[str] | None = None) -> int:
    """`python -m searchrl.trainer.proofs.search_proxy --upstream URL --port N`: serve the proxy."""
    parser = argparse.ArgumentParser(description="the learn-search environment's eval proxy")
    parser.add_argument("--upstream", required=True, help="the served model's root URL (no /v1)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--close-answer", action="store_true", help="end the answer turn as search_env says")
    parser.add_argument(
        "--close-query-tokenizer",
        help="the model's tokenizer folder: close the query turn as search_env says (its stop token ids)",
    )
    parser.add_argument(
        "--answer-tokens", type=int, help="the answer turn's token cap (search_env.answer_budget)"
    )
    args = parser.parse_args(argv)
    query_stops = None
    if args.close_query_tokenizer:
        from transformers import AutoTokenizer

        from searchrl.trainer.proofs.search_env import query_stop_ids

        query_stops = query_stop_ids(AutoTokenizer.from_pretrained(args.close_query_tokenizer))
    app = proxy_app(
        args.upstream, args.close_answer, query_stops=query_stops, answer_tokens=args.answer_tokens
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main", "proxy_app"]
