"""The search agent loop at inference time, turn for turn what verl's ToolAgentLoop does in training.

One episode: render the question with the training prompt and chat template (tools included), generate,
parse hermes `<tool_call>` spans with `searchrl.prompt.parse_tool_calls`, run each `search` call against
/retrieve through `retrieval.client.RetrievalClient` (the client the trainer's tool uses), append the results
as `tool` turns formatted by `searchrl.prompt.format_observation`, and generate again. It ends when a turn has
no tool call (normally an `<answer>`), or after `max_turns + 1` assistant turns: `max_turns` counts searching
turns, as Search-R1 and the trainer's MAX_TURNS do (the trainer sets verl's `max_assistant_turns` to
`max_turns + 1`), and the tool calls of the last turn are not run. As in training, a turn whose only tool calls are malformed ends the
episode (verl's hermes parser drops them); `malformed_feedback=True` instead tells the model what was wrong.

With `search=False` (the no-search baseline) the prompt has no tool and asks for an answer directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm.auto import tqdm

from infer.llm import ChatRenderer, RequestRejectedError, Sampling, ServerLLM, TextGenerator
from infer.settings import InferSettings
from retrieval.client import RetrievalClient
from searchrl.errors import RetrievalUnavailableError
from searchrl.prompt import (
    SEARCH_TOOL_SCHEMA,
    TOOL_NAME,
    ToolCall,
    build_messages,
    format_observation,
    parse_tool_calls,
    queries_from_arguments,
)

log = logging.getLogger(__name__)

FAILURE_PREFIX = "search failed: "  # the trainer's tool starts every failed search's observation with this

# Why an episode ended.
STOP_NO_TOOL_CALL = "no_tool_call"  # the model finished a turn without a tool call (usually an answer)
STOP_MAX_TURNS = "max_turns"  # it was still calling tools in its last allowed turn
STOP_MALFORMED = "malformed_tool_call"  # its only tool calls did not parse
STOP_LLM_ERROR = "llm_error"  # the server rejected a request (e.g. context too long)


@dataclass
class Episode:
    """Everything one question produced; `response` is what the reward scores (all text after the prompt)."""

    question: str
    response: str = ""
    turns: int = 0  # assistant turns generated
    searches: int = 0  # search calls run (each may hold several queries)
    queries: list[str] = field(default_factory=list)
    search_failures: int = 0
    malformed_calls: int = 0
    stop_reason: str = STOP_NO_TOOL_CALL
    error: str | None = None
    completion_tokens: int = 0
    latency_s: float = 0.0
    transcript: list[dict[str, Any]] = field(default_factory=list)  # chat messages, tool turns with queries

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AgentConfig:
    """The loop's knobs (a subset of InferSettings, so tests and the local path can build one directly)."""

    search: bool = True
    max_turns: int = 4  # searching turns; the episode has at most max_turns + 1 assistant turns
    topk: int = 3
    passage_max_chars: int | None = 800
    max_observation_chars: int | None = 2784  # the trainer's budget for top-3 passages of 800 characters
    malformed_feedback: bool = False
    stop_after_tool_call: bool = False
    api: str = "completions"
    sampling: Sampling = Sampling()

    @classmethod
    def from_settings(cls, s: InferSettings) -> AgentConfig:
        return cls(
            search=s.search,
            max_turns=s.max_turns,
            topk=s.topk,
            passage_max_chars=s.passage_max_chars,
            max_observation_chars=s.observation_budget,
            malformed_feedback=s.malformed_feedback,
            stop_after_tool_call=s.stop_after_tool_call,
            api=s.api,
            sampling=Sampling(
                max_tokens=s.max_tokens_per_turn,
                temperature=s.temperature,
                top_p=s.top_p,
                seed=s.seed,
                stop=("</tool_call>",) if s.stop_after_tool_call and s.search else (),
            ),
        )


class SearchAgent:
    """Runs episodes; one instance serves many concurrent questions."""

    def __init__(
        self,
        llm: TextGenerator | ServerLLM,
        retrieval: RetrievalClient | None,
        config: AgentConfig,
        renderer: ChatRenderer | None = None,
    ) -> None:
        if config.search and retrieval is None:
            raise ValueError("search=True needs a RetrievalClient")
        if config.api == "completions" and renderer is None:
            raise ValueError("api='completions' needs a ChatRenderer")
        if config.api == "chat" and not isinstance(llm, ServerLLM):
            raise ValueError("api='chat' needs a ServerLLM")
        self.llm = llm
        self.retrieval = retrieval
        self.config = config
        self.renderer = renderer
        self.tools = [SEARCH_TOOL_SCHEMA] if config.search else None

    async def run(self, question: str) -> Episode:
        ep = Episode(question=question)
        start = time.perf_counter()
        try:
            if self.config.api == "chat":
                await self._run_chat(ep)
            else:
                await self._run_completions(ep)
        except RequestRejectedError as exc:
            ep.stop_reason, ep.error = STOP_LLM_ERROR, str(exc)
            log.warning("question %r: %s", question[:80], exc)
        ep.latency_s = time.perf_counter() - start
        return ep

    # --- one turn's tool calls ------------------------------------------------------------------------------
    async def _execute(self, call: ToolCall, ep: Episode) -> tuple[str, list[str]]:
        """Run one tool call; every failure becomes an observation the model reads (as the trainer's tool)."""
        if call.name != TOOL_NAME:  # verl's ToolAgentLoop answers an unknown name with this text
            return f"Unknown function '{call.name}'. Available tools: ['{TOOL_NAME}']", []
        ep.searches += 1
        try:
            queries = queries_from_arguments(call.arguments)
        except ValueError as exc:  # the trainer's tool words it this way
            ep.search_failures += 1
            return f"{FAILURE_PREFIX}bad arguments: {exc}", []
        ep.queries.extend(queries)
        assert self.retrieval is not None
        try:
            hits = await self.retrieval.search(queries, self.config.topk)
        except RetrievalUnavailableError as exc:
            ep.search_failures += 1
            log.warning("search failed (%s) for %r", exc.kind, queries)
            return f"{FAILURE_PREFIX}{exc.kind}", queries
        text = format_observation(
            queries,
            [[h.contents for h in per_q] for per_q in hits],
            max_chars_per_doc=self.config.passage_max_chars,
            max_chars=self.config.max_observation_chars,
        )
        return text, queries

    async def _tool_turn(self, calls: list[ToolCall], errors: list[str], ep: Episode) -> list[str]:
        """Observations for one assistant turn: results of the valid calls, then (optionally) parse errors."""
        results = await asyncio.gather(*(self._execute(c, ep) for c in calls))
        observations = []
        for text, queries in results:
            observations.append(text)
            ep.transcript.append({"role": "tool", "content": text, "queries": queries})
        if self.config.malformed_feedback:
            for err in errors:
                observations.append(err)
                ep.transcript.append({"role": "tool", "content": err, "queries": []})
        return observations

    def _should_stop(self, calls: list[ToolCall], errors: list[str], ep: Episode) -> bool:
        ep.malformed_calls += len(errors)
        if not self.config.search:
            return True
        if not calls and not (errors and self.config.malformed_feedback):
            ep.stop_reason = STOP_MALFORMED if errors else STOP_NO_TOOL_CALL
            return True
        if ep.turns >= self.config.max_turns + 1:
            ep.stop_reason = STOP_MAX_TURNS
            return True
        return False

    # --- completions mode: the exact training text -------------------------------------------------------------
    async def _run_completions(self, ep: Episode) -> None:
        assert self.renderer is not None
        messages = build_messages(ep.question, search=self.config.search)
        ep.transcript.extend(messages)
        prompt = self.renderer.initial(messages, self.tools)
        start = len(prompt)
        while True:
            out = await self.llm.complete(prompt, self.config.sampling)
            text = out.text
            if self.config.stop_after_tool_call and text.rfind("<tool_call>") > text.rfind("</tool_call>"):
                text += "</tool_call>"  # the stop string itself is not returned
            ep.turns += 1
            ep.completion_tokens += out.completion_tokens
            ep.transcript.append({"role": "assistant", "content": text, "finish_reason": out.finish_reason})
            prompt += self.renderer.close_turn(text)
            parsed = parse_tool_calls(text)
            if self._should_stop(parsed.calls, parsed.errors, ep):
                break
            observations = await self._tool_turn(parsed.calls, parsed.errors, ep)
            prompt += self.renderer.tool_turn(observations, self.tools)
        ep.response = prompt[start:]

    # --- chat mode: the server renders and parses ---------------------------------------------------------------
    async def _run_chat(self, ep: Episode) -> None:
        assert isinstance(self.llm, ServerLLM)
        messages: list[dict[str, Any]] = list(build_messages(ep.question, search=self.config.search))
        ep.transcript.extend(messages)
        parts: list[str] = []
        while True:
            reply = await self.llm.chat(messages, self.tools, self.config.sampling)
            ep.turns += 1
            ep.completion_tokens += reply.completion_tokens
            parsed = parse_tool_calls(reply.content)  # a server without a tool parser leaves them in content
            calls = reply.tool_calls or parsed.calls
            assistant: dict[str, Any] = {
                "role": "assistant",
                "content": parsed.content if calls else reply.content,
            }
            if calls:
                assistant["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            messages.append(assistant)
            ep.transcript.append({**assistant, "finish_reason": reply.finish_reason})
            parts.append(reply.content)
            if self._should_stop(calls, parsed.errors, ep):
                break
            observations = await self._tool_turn(calls, parsed.errors, ep)
            for o in observations:
                messages.append({"role": "tool", "content": o})
                parts.append(f"<tool_response>\n{o}\n</tool_response>")
        ep.response = "\n".join(parts)


async def run_questions(
    agent: SearchAgent, questions: Sequence[str], *, concurrency: int = 16, progress: bool = True
) -> list[Episode]:
    """Run many episodes with at most `concurrency` in flight; results in input order, a tqdm bar on stderr."""
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions), desc="questions", unit="q", disable=not progress)

    async def one(q: str) -> Episode:
        async with sem:
            ep = await agent.run(q)
        bar.update(1)
        return ep

    try:
        return list(await asyncio.gather(*(one(q) for q in questions)))
    finally:
        bar.close()


__all__ = [
    "STOP_LLM_ERROR",
    "STOP_MALFORMED",
    "STOP_MAX_TURNS",
    "STOP_NO_TOOL_CALL",
    "AgentConfig",
    "Episode",
    "SearchAgent",
    "run_questions",
]
