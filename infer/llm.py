"""Talking to the model: the training chat template as text, and an OpenAI-compatible client (sglang, vLLM).

Why `/v1/completions` with our own rendering is the default (api="completions"):
during training verl's ToolAgentLoop never sends messages to a server. It renders the prompt once with the
model's chat template (tools included), appends the *generated tokens verbatim*, then appends the tool turn as
the token-level difference the chat template adds for a `tool` message (verl `ContinuousTokenBuilder`), with
the turn separator ("\\n" after Qwen's `<|im_end|>`) re-inserted. `/v1/chat/completions` instead makes the
server re-render every assistant turn from the *parsed* tool calls (re-serialised JSON, content without the
raw `<tool_call>` text) and needs a server-side tool parser (`--tool-call-parser`), so the model would read a
context it never saw in training. `ChatRenderer` rebuilds the exact training text with the model's own
tokenizer, and the agent sends that text to `/v1/completions`. The chat mode is kept for servers that only
speak chat (hosted APIs); it is close but not token-exact.

Text rather than token ids: OpenAI completions responses carry text, not ids, so the server re-tokenises our
text. Around the special tokens that bound every turn the two agree; inside a turn BPE may merge differently
from what was sampled, which does not change what the model reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from searchrl.errors import InferenceError, RequestRejectedError, RetryableError
from searchrl.http import AsyncClosing, bearer_headers, retry_after_s, retrying
from searchrl.prompt import ToolCall

log = logging.getLogger(__name__)

_MARK = "\u2063searchrl-mark\u2063"
_SYNTHETIC_PREFIX: list[dict[str, Any]] = [
    {"role": "system", "content": "system"},
    {"role": "user", "content": "user"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {}}}],
    },
]


# Sampling fields every generation request carries, whatever the server's defaults. vLLM (`--generation-config
# auto`, its default) and sglang (`--sampling-defaults model`, its default) fill every field a request leaves out
# from the model's generation_config.json; Qwen2.5 instruct ships repetition_penalty 1.05, top_k 20, top_p 0.8,
# so a request without them decodes over penalised, truncated logits. Training (verl's agent loop) sends
# repetition_penalty 1.0; these values are the neutral ones (no penalty, no top-k, no min-p).
PINNED_DECODING: dict[str, float | int] = {"repetition_penalty": 1.0, "top_k": -1, "min_p": 0.0}


@dataclass(frozen=True)
class Completion:
    """One generated turn."""

    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length" (max_tokens reached)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Which stop string ended the turn (None: EOS, length, or a stop token id), when the server says so
    # (sglang `matched_stop`, vLLM `stop_reason`); `stop_reported` False = the server does not tell.
    matched_stop: str | None = None
    stop_reported: bool = False
    # seconds the model spent on this turn (the request's round trip; the local engine: its batch), without the
    # wait for a free slot: what a question's latency is made of
    model_s: float = field(default=0.0, compare=False)

    def stopped_at(self, stop: str) -> bool:
        """Whether generation ended at the stop string `stop` (which servers do not return in the text).

        A server that does not report its stop falls back to the text: a turn with an unclosed opening tag that
        finished with "stop" is taken as cut at `stop`. Only then can an EOS be mistaken for the stop string.
        """
        if self.finish_reason != "stop":
            return False
        if self.stop_reported:
            return self.matched_stop == stop
        opening = stop.replace("</", "<", 1)
        return self.text.rfind(opening) > self.text.rfind(stop)


@dataclass(frozen=True)
class ChatReply:
    """One assistant message from /v1/chat/completions (tool calls parsed by the server, if it can)."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_call_ids: list[str] = field(default_factory=list)  # the server's ids, to answer with tool_call_id


@dataclass(frozen=True)
class Sampling:
    """Decoding parameters sent with every request."""

    max_tokens: int = 500
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    repetition_penalty: float = float(PINNED_DECODING["repetition_penalty"])  # pinned, see PINNED_DECODING
    top_k: int = int(PINNED_DECODING["top_k"])
    min_p: float = float(PINNED_DECODING["min_p"])


class TextGenerator(Protocol):
    """What the agent needs from a model in completions mode (server or local)."""

    async def complete(self, prompt: str, sampling: Sampling) -> Completion: ...

    async def aclose(self) -> None: ...


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer (a few MB) of a HF model id or local folder, or one clear error."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise InferenceError(
            f"cannot load the tokenizer {name_or_path!r} ({exc.__class__.__name__}); set --tokenizer to the "
            "HF id or folder of the served model"
        ) from exc


class ChatRenderer:
    """Renders prompts and turn boundaries exactly as verl's ToolAgentLoop builds them in training."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise InferenceError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                "point --tokenizer at the instruct model the agent was trained from"
            )
        self.tokenizer = tokenizer
        self._end_of_turn = self._derive_end_of_turn()
        # The model generates the close token ("<|im_end|>") and stops; the separator after it ("\n" for Qwen)
        # belongs to the next turn, which is where verl's builder re-inserts it. A trajectory's last turn has none.
        eos = getattr(tokenizer, "eos_token", None)
        if isinstance(eos, str) and eos and self._end_of_turn.startswith(eos):
            self._close, self._separator = eos, self._end_of_turn[len(eos) :]
        else:
            self._close, self._separator = self._end_of_turn, ""

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> ChatRenderer:
        """Load only the tokenizer (a few MB) of a HF model id or local folder."""
        return cls(load_tokenizer(name_or_path))

    def _render(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None, gen: bool
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=gen, tokenize=False
        )
        return str(text)

    def _derive_end_of_turn(self) -> str:
        # What the template writes after a turn's content: Qwen "<|im_end|>\n", Llama 3 "<|eot_id|>". The model
        # generates the close token and stops; verl re-inserts the separator before the next turn.
        text = self._render([{"role": "user", "content": _MARK}], tools=None, gen=False)
        if _MARK not in text:
            raise InferenceError("the chat template drops message content; cannot derive its turn boundary")
        return text.rsplit(_MARK, 1)[1]

    @property
    def end_of_turn(self) -> str:
        return self._end_of_turn

    def initial(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The first prompt: the conversation so far plus the assistant header, tools in the system block."""
        return self._render(messages, tools=tools, gen=True)

    def close_turn(self, generated: str) -> str:
        """The assistant text followed by the template's turn close, as the training token stream has it."""
        return generated + self._close

    def count(self, text: str) -> int:
        """Tokens in `text` as the model reads it (special tokens of the template included, none added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def truncate(self, text: str, max_tokens: int) -> str:
        """`text` cut to its first `max_tokens` tokens (verl keeps `response_ids[:response_length]`)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        return str(self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=False))

    def tool_turn(
        self, observations: list[str], tools: list[dict[str, Any]] | None, *, after_close: bool = True
    ) -> str:
        """The text a chat template adds for `tool` messages plus the next assistant header.

        Rendered as the difference between a synthetic conversation with and without the tool messages,
        which is how verl's ContinuousTokenBuilder derives it, so any template (Qwen, Llama, ...) works.
        The turn separator ("\\n" for Qwen) comes first only `after_close`: verl's QwenContinuousTokenBuilder
        inserts it only when the context ends with `<|im_end|>`, so a length-cut turn is followed directly.
        """
        prefix = self._render(_SYNTHETIC_PREFIX, tools=tools, gen=False)
        full = self._render(
            _SYNTHETIC_PREFIX + [{"role": "tool", "content": o} for o in observations], tools=tools, gen=True
        )
        if not full.startswith(prefix):
            raise InferenceError("the chat template re-renders earlier turns when a tool message is added")
        return (self._separator if after_close else "") + full[len(prefix) :]


def _matched_stop(choice: dict[str, Any]) -> tuple[bool, str | None]:
    """(reported, stop string) from a completion choice: sglang's `matched_stop`, vLLM's `stop_reason`.

    Both hold the stop string that ended generation, an int for a stop token id (EOS included in sglang), or
    None (EOS in vLLM, length); a choice with neither key comes from a server that does not say.
    """
    for key in ("matched_stop", "stop_reason"):
        if key in choice:
            value = choice[key]
            return True, value if isinstance(value, str) else None
    return False, None


class ServerLLM(AsyncClosing):
    """Async client for an OpenAI-compatible server (`/v1/completions`, `/v1/chat/completions`, `/v1/models`).

    Retries connection errors, timeouts, 429 and 5xx with jittered exponential back-off; other 4xx raise
    `RequestRejectedError` at once. The API key is sent as a bearer header and never logged.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 8,
        retry_base_s: float = 2.0,
        retry_max_wait_s: float = 120.0,
        max_connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dropped_fields: set[str] = set()  # pinned sampling fields this server rejected (_generate)
        self.identity: dict[str, Any] = {}  # model_identity(), once the evaluator asked
        self.max_retries = max_retries
        self.retry_base_s = retry_base_s
        self.retry_max_wait_s = retry_max_wait_s
        self._client = httpx.AsyncClient(
            headers=bearer_headers(api_key),
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request with retries (searchrl/http.py `retrying`): with the default 8 the waits, jittered 2, 4,
        8, ... s up to `retry_max_wait_s` or the server's Retry-After, add up to 3-6 minutes, within which an LLM
        server that restarts (a preempted replica, an OOM) comes back and the run goes on instead of being lost."""
        url = f"{self.base_url}{path}"

        def warn(state: Any) -> None:
            log.warning(
                "LLM request to %s failed (%s); retry %d in %.1fs",
                url,
                state.outcome.exception(),
                state.attempt_number,
                state.upcoming_sleep,
            )

        try:
            async for attempt in retrying(
                attempts=self.max_retries + 1,
                base_s=self.retry_base_s,
                max_s=self.retry_max_wait_s,
                before_sleep=warn,
            ):
                with attempt:
                    return await self._request_once(method, url, body)
        except RetryableError as exc:
            raise InferenceError(
                f"LLM server {self.base_url} failed after {self.max_retries + 1} attempts: {exc}; "
                "check that sglang/vLLM is up (--llm-url)"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request_once(self, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            resp = await self._client.request(method, url, json=body)
        except httpx.TimeoutException:
            raise RetryableError("timed out") from None
        except httpx.TransportError as exc:
            raise RetryableError(f"cannot connect ({exc.__class__.__name__})") from None
        if resp.status_code == 200:
            try:
                payload: dict[str, Any] = resp.json()
            except json.JSONDecodeError as exc:
                raise InferenceError(f"{url} answered 200 with a body that is not JSON") from exc
            return payload
        detail = resp.text[:300].replace("\n", " ")
        if resp.status_code != 429 and resp.status_code < 500:
            raise RequestRejectedError(
                f"{url} rejected the request: HTTP {resp.status_code}: {detail}",
                status=resp.status_code,
                detail=detail,
            )
        raise RetryableError(
            f"HTTP {resp.status_code}: {detail}", retry_after=retry_after_s(resp.headers.get("Retry-After"))
        )

    async def list_models(self) -> list[str]:
        payload = await self._request("GET", "/models")
        return [str(m.get("id")) for m in payload.get("data", []) if isinstance(m, dict)]

    async def check_model(self, *, wait_s: float = 0.0, poll_s: float = 2.0) -> None:
        """Fail early when the server is down or does not serve the model, naming what it serves.

        A refused connection is an answer: InferenceError at once (a dead port must not cost the minutes of
        back-off the generation requests get). With `wait_s` > 0 (`--wait-for-llm`, a server still loading
        weights) /models is polled every `poll_s` seconds, with a progress line, until it answers or time is up.
        """
        url = f"{self.base_url}/models"
        loop = asyncio.get_running_loop()
        started = loop.time()
        logged = started - 10  # the first wait logs at once
        while True:
            try:
                resp = await self._client.get(url, timeout=httpx.Timeout(30.0, connect=5.0))
            except httpx.TimeoutException:
                problem = "timed out"
            except httpx.TransportError as exc:
                problem = f"cannot connect ({exc.__class__.__name__})"
            else:
                if resp.status_code == 200:
                    break
                detail = resp.text[:200].replace("\n", " ")
                if resp.status_code != 429 and resp.status_code < 500:
                    raise RequestRejectedError(
                        f"{url} rejected the request: HTTP {resp.status_code}: {detail}"
                    )
                problem = f"HTTP {resp.status_code}: {detail}"
            waited = loop.time() - started
            if waited >= wait_s:
                more = (
                    f"gave up after --wait-for-llm {wait_s:g}"
                    if wait_s > 0
                    else "pass --wait-for-llm SECONDS while it loads"
                )
                raise InferenceError(
                    f"LLM server {self.base_url} is not answering: {problem}; start sglang/vLLM there or "
                    f"set --llm-url ({more})"
                )
            if loop.time() - logged >= 10:
                logged = loop.time()
                log.info(
                    "waiting for the LLM server at %s (%s): %.0f of %.0f s",
                    self.base_url,
                    problem,
                    waited,
                    wait_s,
                )
            await asyncio.sleep(min(poll_s, wait_s - waited))
        try:
            payload = resp.json()
        except json.JSONDecodeError as exc:
            raise InferenceError(f"{url} answered 200 with a body that is not JSON") from exc
        data = payload.get("data", []) if isinstance(payload, dict) else []
        served = [str(m.get("id")) for m in data if isinstance(m, dict)]
        if served and self.model not in served:
            raise InferenceError(
                f"model {self.model!r} is not served at {self.base_url}; it serves {served} (set --model)"
            )

    def _sampling_body(self, sampling: Sampling) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "repetition_penalty": sampling.repetition_penalty,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        for name in self.dropped_fields:
            body.pop(name, None)
        return body

    async def _generate(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a generation request; a server that rejects a pinned field by name gets it no more.

        Servers that do not know `repetition_penalty`/`top_k`/`min_p` usually ignore them; one that answers
        400/422 naming a field (OpenAI: "Unrecognized request argument supplied: top_k") loses only that
        field, for this client, with a warning, and `dropped_fields` records it in the result's protocol.
        """
        while True:
            try:
                return await self._request("POST", path, body)
            except RequestRejectedError as exc:
                named = [
                    f
                    for f in PINNED_DECODING
                    if f in body and exc.status in (400, 422) and re.search(rf"\b{f}\b", exc.detail)
                ]
                if not named:
                    raise
                for f in named:
                    if f not in self.dropped_fields:
                        log.warning(
                            "%s rejects the sampling field %r (%s); it is left out for this server, so the "
                            "server's default applies to it (recorded in the protocol)",
                            self.base_url,
                            f,
                            exc.detail[:120],
                        )
                    self.dropped_fields.add(f)
                body = {k: v for k, v in body.items() if k not in named}

    async def model_identity(self) -> dict[str, Any]:
        """What the server says identifies the weights it serves (empty when it says nothing).

        vLLM and sglang put the model path in `/v1/models` (`root`); sglang also answers `GET /get_model_info`
        (`model_path`, and `weight_version` after in-place weight updates). A new checkpoint served under the
        same `--served-model-name` from another path thus gets another protocol hash. The same path with new
        files in it is not told apart (docs/inference.md).
        """
        out: dict[str, Any] = {}
        try:
            resp = await self._client.get(f"{self.base_url}/models", timeout=httpx.Timeout(10.0, connect=5.0))
            data = resp.json().get("data", []) if resp.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            data = []
        for m in data if isinstance(data, list) else []:
            if isinstance(m, dict) and str(m.get("id")) == self.model:
                for key in ("root", "parent"):
                    if m.get(key):
                        out[key] = str(m[key])
        root = self.base_url.removesuffix("/v1")
        try:
            resp = await self._client.get(f"{root}/get_model_info", timeout=httpx.Timeout(10.0, connect=5.0))
            info = resp.json() if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            info = {}
        if isinstance(info, dict):
            for key in ("model_path", "weight_version"):
                if info.get(key) is not None:
                    out[key] = str(info[key])
        return out

    async def complete(self, prompt: str, sampling: Sampling) -> Completion:
        t0 = time.perf_counter()
        payload = await self._generate("/completions", {**self._sampling_body(sampling), "prompt": prompt})
        took = time.perf_counter() - t0
        try:
            choice = payload["choices"][0]
            usage = payload.get("usage") or {}
            reported, matched = _matched_stop(choice)
            return Completion(
                text=str(choice["text"]),
                finish_reason=str(choice.get("finish_reason") or "stop"),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                matched_stop=matched,
                stop_reported=reported,
                model_s=took,
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise InferenceError(f"{self.base_url}/completions answered without choices[0].text") from exc

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: Sampling
    ) -> ChatReply:
        body = {**self._sampling_body(sampling), "messages": messages}
        if tools:
            body["tools"] = tools
        payload = await self._generate("/chat/completions", body)
        try:
            choice = payload["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise InferenceError(
                f"{self.base_url}/chat/completions answered without choices[0].message"
            ) from exc
        calls, ids = [], []
        for tc in message.get("tool_calls") or []:
            if tc.get("id"):
                ids.append(str(tc["id"]))
            fn = tc.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {"_unparsed": args}
            calls.append(ToolCall(name=str(fn.get("name")), arguments=args if isinstance(args, dict) else {}))
        usage = payload.get("usage") or {}
        return ChatReply(
            content=str(message.get("content") or ""),
            tool_calls=calls,
            finish_reason=str(choice.get("finish_reason") or "stop"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            tool_call_ids=ids if len(ids) == len(calls) else [],
        )


__all__ = [
    "PINNED_DECODING",
    "ChatRenderer",
    "ChatReply",
    "Completion",
    "RequestRejectedError",
    "Sampling",
    "ServerLLM",
    "TextGenerator",
    "load_tokenizer",
]
