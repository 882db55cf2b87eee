"""The search agent loop at inference time, turn for turn what verl's ToolAgentLoop does in training.

One episode: render the question with the training prompt and chat template (the tool schema as verl renders
it), generate, parse hermes `<tool_call>` spans with `searchrl.prompt.parse_tool_calls`, run the first
`max_parallel_calls` `search` calls against /retrieve through `searchrl.retrieval.client.RetrievalClient` (the client
the trainer's tool uses), append the results as `tool` turns formatted by `searchrl.prompt.format_observation`,
and generate again. The rules come from `searchrl.rollout.RolloutSpec`, the object training reads too: at most
`max_turns` searching turns and `max_turns + 1` assistant turns (the tool calls of the last turn are not run);
each turn may generate what is left of the token budget; the episode ends when the response (observations
included) reaches `max_response_tokens`, and an observation that would cross it is not appended, as verl does.
As in training, a turn whose only tool calls are malformed ends the episode (verl's hermes parser drops them);
`malformed_feedback=True` instead tells the model what was wrong.

Failures are counted, never hidden: each failed search adds to `failure_kinds` (the client's kinds: timeout,
connect, http_503, malformed, ...), an LLM 4xx is recorded as `llm_error`, a length-cut turn as
`length_truncated_turns`. What the model causes (a call without a usable query, an empty Search-R1 query, a query
the service's schema refuses: `searchrl.prompt.POLICY_FAILURES`) goes to `model_errors` instead: it is the
model's behaviour, not the service's. A quota error (429), a rejected token (401/403) or a replay-cache miss
(404) cannot get better by going on, nor can `max_consecutive_failures` service failures in a row (a dead
backend): the agent raises `FatalSearchError` and the run stops at once.

With `search=False` (the no-search baseline) the prompt has no tool and asks for an answer directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from tqdm.auto import tqdm

from searchrl.errors import FatalSearchError, RequestRejectedError, RetrievalUnavailableError
from searchrl.infer.llm import ChatRenderer, Completion, Sampling, ServerLLM, TextGenerator
from searchrl.infer.settings import InferSettings
from searchrl.prompt import (
    POLICY_FAILURES,
    SEARCH_R1_INVALID,
    SEARCH_R1_STOP,
    TOOL_NAME,
    ParsedTurn,
    ToolCall,
    build_messages,
    cut_search_r1_turn,
    format_observation,
    format_search_r1_observation,
    parse_search_r1_action,
    parse_tool_calls,
    queries_from_arguments,
)
from searchrl.retrieval.client import Hit, RetrievalClient
from searchrl.rollout import RolloutSpec, training_tool_schemas, truncate_tool_response

log = logging.getLogger(__name__)

FAILURE_PREFIX = "search failed: "  # the trainer's tool starts every failed search's observation with this

# Why an episode ended.
STOP_NO_TOOL_CALL = "no_tool_call"  # the model finished a turn without a tool call (usually an answer)
STOP_MAX_TURNS = "max_turns"  # it was still calling tools in its last allowed turn
STOP_MALFORMED = "malformed_tool_call"  # its only tool calls did not parse
STOP_LENGTH = "length"  # its last turn hit the token budget without a tool call
STOP_RESPONSE_BUDGET = "response_budget"  # the trajectory reached max_response_tokens (training's cut)
STOP_LLM_ERROR = "llm_error"  # the server rejected a request (e.g. context too long)

# Client failure kinds that no retry or later question can fix: stop the run at once.
FATAL_KINDS = {
    "http_401": "the retrieval service rejected the token (401): set RETRIEVAL_API_KEY",
    "http_403": "the retrieval service refused access (403): check RETRIEVAL_API_KEY",
    "http_404": "the retrieval service answered 404 (a replay-cache miss, or a URL that is not /retrieve)",
    "http_429": "the search quota is spent (429): raise the backend's budget or wait for it to refill",
}


@dataclass
class Episode:
    """Everything one question produced; `response` is what the reward scores (all text after the prompt)."""

    question: str
    response: str = ""
    turns: int = 0  # assistant turns generated
    searches: int = 0  # search calls run (each may hold several queries)
    queries: list[str] = field(default_factory=list)
    search_failures: int = 0  # failed searches the service caused (model-caused ones are in model_errors)
    failure_kinds: dict[str, int] = field(default_factory=dict)  # search failures by kind
    model_errors: dict[str, int] = field(default_factory=dict)  # POLICY_FAILURES kinds, unknown_tool
    malformed_calls: int = 0
    dropped_calls: int = 0  # tool calls past max_parallel_calls, not run (as in training)
    length_truncated_turns: int = 0  # turns the token budget cut off (finish_reason "length")
    stop_reason: str = STOP_NO_TOOL_CALL
    error: str | None = None  # the LLM server's rejection, when stop_reason is llm_error
    prompt_tokens: int = 0
    response_tokens: int = 0  # tokens after the prompt, observations included (training's response length)
    completion_tokens: int = 0
    latency_s: float = 0.0  # the question's own time: model_s + search_s (no wait for a free engine slot)
    model_s: float = 0.0  # time in the model over its turns (server round trips; local: its batches)
    search_s: float = 0.0  # time in retrieval calls
    wall_s: float = 0.0  # start to end, waits for the engine included (grows with --concurrency)
    transcript: list[dict[str, Any]] = field(default_factory=list)  # chat messages, tool turns with queries

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def count_failure(self, kind: str) -> None:
        if kind in POLICY_FAILURES:
            self.count_model_error(kind)
            return
        self.search_failures += 1
        self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1

    def count_model_error(self, kind: str) -> None:
        self.model_errors[kind] = self.model_errors.get(kind, 0) + 1


@dataclass(frozen=True)
class AgentConfig:
    """The loop's knobs: the shared rollout rules plus eval-only options (decoding, feedback, API)."""

    search: bool = True
    rollout: RolloutSpec = RolloutSpec()
    max_observation_chars: int | None = None  # None = the trainer's budget (rollout.observation_chars)
    max_observation_tokens: int | None = None  # search-r1: observation cut to this many tokens
    max_consecutive_failures: int = 0  # service search failures in a row that stop the run; 0 = never
    malformed_feedback: bool = False
    stop_after_tool_call: bool = False
    api: str = "completions"
    sampling: Sampling = Sampling()

    @property
    def observation_chars(self) -> int:
        return self.max_observation_chars or self.rollout.observation_chars

    @classmethod
    def from_settings(cls, s: InferSettings) -> AgentConfig:
        return cls(
            search=s.search,
            rollout=s.rollout,
            max_observation_chars=s.observation_budget,
            max_observation_tokens=s.max_observation_tokens,
            max_consecutive_failures=s.max_consecutive_failures,
            malformed_feedback=s.malformed_feedback,
            stop_after_tool_call=s.stop_after_tool_call,
            api=s.api,
            sampling=Sampling(
                max_tokens=s.max_response_tokens,
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
        if config.api == "chat" and config.rollout.prompt_format == "search-r1":
            raise ValueError(
                "prompt_format='search-r1' continues one assistant turn: it needs api='completions'"
            )
        self.llm = llm
        self.retrieval = retrieval
        self.config = config
        self.spec = config.rollout
        self.renderer = renderer
        # What the model saw in training: verl's rendering of the schema (it drops `items`), searchrl/rollout.py.
        self.tools = (
            training_tool_schemas() if config.search and config.rollout.prompt_format == "searchrl" else None
        )
        self._failures_in_a_row = 0  # service search failures since the last search that worked

    async def run(self, question: str) -> Episode:
        """One episode. Raises FatalSearchError (stop the run) and InferenceError (LLM gone after retries)."""
        ep = Episode(question=question)
        start = time.perf_counter()
        try:
            if self.config.api == "chat":
                await self._run_chat(ep)
            elif self.spec.prompt_format == "search-r1" and self.config.search:
                await self._run_completions(ep, _SearchR1Turns(self))
            else:
                await self._run_completions(ep, _HermesTurns(self))
        except RequestRejectedError as exc:
            ep.stop_reason, ep.error = STOP_LLM_ERROR, str(exc)
            log.warning("question %r: %s", question[:80], exc)
        ep.wall_s = time.perf_counter() - start
        # chat replies carry no model time: there the whole wall time is the latency, as before
        ep.latency_s = ep.model_s + ep.search_s if ep.model_s else ep.wall_s
        return ep

    # --- one turn's tool calls ------------------------------------------------------------------------------
    async def _execute(self, call: ToolCall, ep: Episode) -> tuple[str, list[str]]:
        """Run one tool call; every failure becomes an observation the model reads (as the trainer's tool)."""
        if call.name != TOOL_NAME:  # verl's ToolAgentLoop answers an unknown name with this text
            ep.count_model_error("unknown_tool")
            return f"Unknown function '{call.name}'. Available tools: ['{TOOL_NAME}']", []
        ep.searches += 1
        try:
            queries = queries_from_arguments(call.arguments)
        except ValueError as exc:  # the trainer's tool words it this way
            ep.count_model_error("bad_arguments")
            return f"{FAILURE_PREFIX}bad arguments: {exc}", []
        ep.queries.extend(queries)
        hits = await self._search(queries, ep)
        if isinstance(hits, str):
            return f"{FAILURE_PREFIX}{hits}", queries
        text = format_observation(
            queries,
            [[h.contents for h in per_q] for per_q in hits],
            max_chars_per_doc=self.spec.passage_max_chars,
            max_chars=self.config.observation_chars,
        )
        return truncate_tool_response(text, self.spec.observation_chars), queries

    async def _tool_turn(self, parsed: ParsedTurn, ep: Episode) -> list[str]:
        """Observations for one assistant turn: the first max_parallel_calls calls, then (optionally) errors."""
        calls = parsed.calls[
            : self.spec.max_parallel_calls
        ]  # verl: agent_data.tool_calls[:max_parallel_calls]
        ep.dropped_calls += len(parsed.calls) - len(calls)
        results = await asyncio.gather(*(self._execute(c, ep) for c in calls))
        observations = []
        for text, queries in results:
            observations.append(text)
            ep.transcript.append({"role": "tool", "content": text, "queries": queries})
        if self.config.malformed_feedback:
            for err in parsed.errors:
                observations.append(err)
                ep.transcript.append({"role": "tool", "content": err, "queries": []})
        return observations

    def _should_stop(self, parsed: ParsedTurn, finish_reason: str, ep: Episode) -> bool:
        """verl's order: response budget, then turn limits, then 'no tool call' ends the episode."""
        ep.malformed_calls += len(parsed.errors)
        if not self.config.search:
            ep.stop_reason = STOP_LENGTH if finish_reason == "length" else STOP_NO_TOOL_CALL
            return True
        if ep.response_tokens >= self.spec.max_response_tokens:
            ep.stop_reason = STOP_RESPONSE_BUDGET
            return True
        has_feedback = bool(parsed.errors) and self.config.malformed_feedback
        if not parsed.calls and not has_feedback:
            if parsed.errors:
                ep.stop_reason = STOP_MALFORMED
            else:
                ep.stop_reason = STOP_LENGTH if finish_reason == "length" else STOP_NO_TOOL_CALL
            return True
        if ep.turns >= self.spec.max_assistant_turns:
            ep.stop_reason = STOP_MAX_TURNS
            return True
        return False

    def _sampling(self, context_tokens: int) -> Sampling | None:
        """This turn's sampling with the training rule's token budget; None when nothing is left."""
        budget = self.spec.turn_token_budget(context_tokens)
        return replace(self.config.sampling, max_tokens=budget) if budget > 0 else None

    def _first_prompt(self, ep: Episode, messages: list[dict[str, str]], tools: Any) -> tuple[str, int]:
        """The rendered first prompt and its token count (the episode's prompt_tokens); messages join the transcript."""
        assert self.renderer is not None
        ep.transcript.extend(messages)
        prompt = self.renderer.initial(messages, tools)
        ep.prompt_tokens = self.renderer.count(prompt)
        return prompt, ep.prompt_tokens

    # --- completions mode: the exact training text, in either prompt format ---------------------------------------
    async def _run_completions(self, ep: Episode, turns: _Turns) -> None:
        """One loop for both prompt formats: generate a turn, let the format answer it (tool turns or Search-R1's
        `<information>`), stop where the format or the shared budgets say. As verl: a turn may generate what is
        left of the budget, and what the environment appends is dropped, ending the episode, when it would
        carry the response to `max_response_tokens`."""
        renderer = self.renderer
        assert renderer is not None
        prompt, context = self._first_prompt(ep, turns.messages(ep.question), turns.tools)
        start = len(prompt)
        while True:
            sampling = self._sampling(context)
            if sampling is None:
                ep.stop_reason = STOP_RESPONSE_BUDGET
                break
            sampling = turns.sampling(sampling, ep)
            out = await self.llm.complete(prompt, sampling)
            text, appended = turns.turn(out, sampling)
            ep.turns += 1
            ep.completion_tokens += out.completion_tokens
            ep.model_s += out.model_s
            ep.length_truncated_turns += out.finish_reason == "length"
            ep.transcript.append({"role": "assistant", "content": text, "finish_reason": out.finish_reason})
            prompt += appended
            context = renderer.count(prompt)
            ep.response_tokens = context - ep.prompt_tokens
            answer = await turns.answer(text, out.finish_reason, ep)
            if answer is None:
                break
            after = renderer.count(prompt + answer)
            if after - ep.prompt_tokens >= self.spec.max_response_tokens:
                ep.stop_reason = STOP_RESPONSE_BUDGET  # verl drops the observation that crosses the budget
                break
            prompt, context = prompt + answer, after
            ep.response_tokens = context - ep.prompt_tokens
        prompt += turns.closing
        ep.response = renderer.truncate(prompt[start:], self.spec.max_response_tokens)

    async def _search(self, queries: list[str], ep: Episode) -> list[list[Hit]] | str:
        """The hits, or the failure kind (counted in `ep`); a fatal kind (quota, 401/403, replay miss) raises."""
        assert self.retrieval is not None
        t0 = time.perf_counter()
        try:
            hits = await self.retrieval.search(queries, self.spec.topk)
        except RetrievalUnavailableError as exc:
            ep.search_s += time.perf_counter() - t0
            ep.count_failure(exc.kind)
            if exc.kind in FATAL_KINDS:
                raise FatalSearchError(
                    f"{FATAL_KINDS[exc.kind]} ({exc})", kind=exc.kind, status=exc.status
                ) from exc
            log.warning("search failed (%s) for %r", exc.kind, queries)
            if exc.kind not in POLICY_FAILURES:
                self._failures_in_a_row += 1
                limit = self.config.max_consecutive_failures
                if limit and self._failures_in_a_row >= limit:
                    raise FatalSearchError(
                        f"{self._failures_in_a_row} searches in a row failed (last: {exc.kind}); the "
                        "retrieval backend looks down (--max-consecutive-failures)",
                        kind="backend_down",
                        status=exc.status,
                    ) from exc
            return exc.kind
        ep.search_s += time.perf_counter() - t0
        self._failures_in_a_row = 0
        return hits

    # --- Search-R1's format: <search> actions, <information> spliced into the same assistant turn ------------------
    async def _search_r1_observation(self, query: str, ep: Episode) -> str:
        ep.searches += 1
        if not query:
            # Search-R1 sends an empty query to its retriever and shows whatever comes back; a service that
            # refuses it (422) is not an outage. No search is spent: the model reads an empty result.
            ep.count_model_error("empty_query")
            return format_search_r1_observation([])
        ep.queries.append(query)
        hits = await self._search([query], ep)
        if isinstance(hits, str):
            obs = format_search_r1_observation([f"\n{FAILURE_PREFIX}{hits}"])
        else:
            obs = format_search_r1_observation(
                [h.contents for h in hits[0]], max_chars=self.config.observation_chars
            )
        if self.config.max_observation_tokens is not None and self.renderer is not None:
            # Search-R1 `_process_next_obs`: the observation's token ids are cut to max_obs_length.
            obs = self.renderer.truncate(obs, self.config.max_observation_tokens)
        return obs

    # --- chat mode: the server renders and parses ---------------------------------------------------------------
    async def _run_chat(self, ep: Episode) -> None:
        """OpenAI chat: tool calls carry an `id` and string `arguments`; tool messages answer by `tool_call_id`."""
        assert isinstance(self.llm, ServerLLM)
        messages: list[dict[str, Any]] = list(build_messages(ep.question, search=self.config.search))
        ep.transcript.extend(messages)
        parts: list[str] = []
        context = 0
        while True:
            sampling = self._sampling(context)
            if sampling is None:
                ep.stop_reason = STOP_RESPONSE_BUDGET
                break
            reply = await self.llm.chat(messages, self.tools, sampling)
            ep.turns += 1
            ep.completion_tokens += reply.completion_tokens
            ep.length_truncated_turns += reply.finish_reason == "length"
            if ep.turns == 1:
                ep.prompt_tokens = reply.prompt_tokens
            context = reply.prompt_tokens + reply.completion_tokens
            ep.response_tokens = max(0, context - ep.prompt_tokens)
            text_parsed = parse_tool_calls(
                reply.content
            )  # a server without a tool parser leaves them in content
            calls = reply.tool_calls or text_parsed.calls
            parsed = ParsedTurn(calls=calls, errors=text_parsed.errors, content=text_parsed.content)
            run_calls = calls[: self.spec.max_parallel_calls]
            ids = [tc_id for tc_id in (reply.tool_call_ids or [])][: len(run_calls)]
            ids += [f"call_{uuid.uuid4().hex[:12]}" for _ in range(len(run_calls) - len(ids))]
            assistant: dict[str, Any] = {
                "role": "assistant",
                "content": text_parsed.content if calls else reply.content,
            }
            if run_calls:
                assistant["tool_calls"] = [
                    {
                        "id": tc_id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": json.dumps(c.arguments, ensure_ascii=False),
                        },
                    }
                    for tc_id, c in zip(ids, run_calls, strict=True)
                ]
            messages.append(assistant)
            ep.transcript.append({**assistant, "finish_reason": reply.finish_reason})
            parts.append(reply.content)
            if self._should_stop(parsed, reply.finish_reason, ep):
                break
            observations = await self._tool_turn(parsed, ep)
            for k, o in enumerate(observations):
                msg: dict[str, Any] = {"role": "tool", "content": o}
                if k < len(ids):
                    msg["tool_call_id"] = ids[k]
                messages.append(msg)
                parts.append(f"<tool_response>\n{o}\n</tool_response>")
        ep.response = "\n".join(parts)


class _Turns(Protocol):
    """What one prompt format adds to the completions loop (`SearchAgent._run_completions`)."""

    tools: list[dict[str, Any]] | None  # the tool schema the chat template renders, if any
    closing: str  # appended to the prompt when the episode ends

    def messages(self, question: str) -> list[dict[str, str]]: ...

    def sampling(self, sampling: Sampling, ep: Episode) -> Sampling:
        """This turn's sampling (stop strings), given the turns generated so far."""
        ...

    def turn(self, out: Completion, sampling: Sampling) -> tuple[str, str]:
        """(the turn's text, what it appends to the prompt)."""
        ...

    async def answer(self, text: str, finish_reason: str, ep: Episode) -> str | None:
        """What the environment appends after the turn; None ends the episode, with `ep.stop_reason` set."""
        ...


class _HermesTurns:
    """The training format: hermes `<tool_call>` spans, answered by `tool` turns (verl's ToolAgentLoop)."""

    closing = ""

    def __init__(self, agent: SearchAgent) -> None:
        assert agent.renderer is not None
        self.agent, self.renderer, self.tools = agent, agent.renderer, agent.tools

    def messages(self, question: str) -> list[dict[str, str]]:
        return build_messages(question, search=self.agent.config.search)

    def sampling(self, sampling: Sampling, ep: Episode) -> Sampling:
        return sampling

    def turn(self, out: Completion, sampling: Sampling) -> tuple[str, str]:
        text = out.text
        if self.agent.config.stop_after_tool_call and out.stopped_at("</tool_call>"):
            text += "</tool_call>"  # the stop string itself is not returned
        # A length-cut turn has no end-of-turn token: verl appends the generated tokens verbatim.
        return text, text if out.finish_reason == "length" else self.renderer.close_turn(text)

    async def answer(self, text: str, finish_reason: str, ep: Episode) -> str | None:
        parsed = parse_tool_calls(text)
        if self.agent._should_stop(parsed, finish_reason, ep):
            return None
        observations = await self.agent._tool_turn(parsed, ep)
        return self.renderer.tool_turn(observations, self.tools, after_close=finish_reason != "length")


class _SearchR1Turns:
    """Search-R1's rollout (search_r1/llm_agent/generation.py): up to max_turns actions, then a last turn.

    A turn is cut after its first `</search>` or `</answer>`; an answer ends the episode; a search appends
    `<information>` and generation continues in the same assistant turn; a turn with neither gets their
    "My previous action is invalid" text. The budgets are the shared RolloutSpec's.
    """

    tools: list[dict[str, Any]] | None = None  # the instructions teach the tags; no tool schema

    def __init__(self, agent: SearchAgent) -> None:
        assert agent.renderer is not None
        self.agent, self.spec = agent, agent.spec
        self.closing = agent.renderer.close_turn("")  # the one assistant turn closes when the episode ends

    def messages(self, question: str) -> list[dict[str, str]]:
        return build_messages(question, prompt_format="search-r1")

    def sampling(self, sampling: Sampling, ep: Episode) -> Sampling:
        last = ep.turns + 1 >= self.spec.max_assistant_turns
        return replace(sampling, stop=() if last else (SEARCH_R1_STOP,))

    def turn(self, out: Completion, sampling: Sampling) -> tuple[str, str]:
        text = out.text
        # The stop string itself is not returned: put it back only when generation stopped at it, not at
        # EOS after an unclosed "<search> q" (the server's matched_stop / stop_reason tells them apart).
        if sampling.stop and SEARCH_R1_STOP not in text and out.stopped_at(SEARCH_R1_STOP):
            text += SEARCH_R1_STOP
        text = cut_search_r1_turn(text)
        return text, text

    async def answer(self, text: str, finish_reason: str, ep: Episode) -> str | None:
        action, content = parse_search_r1_action(text)
        if ep.response_tokens >= self.spec.max_response_tokens:
            ep.stop_reason = STOP_RESPONSE_BUDGET
            return None
        if action == "answer":
            ep.stop_reason = STOP_NO_TOOL_CALL
            return None
        if ep.turns >= self.spec.max_assistant_turns:  # the last turn: no search runs after it
            ep.stop_reason = STOP_MAX_TURNS if action == "search" else STOP_MALFORMED
            return None
        if action == "search":
            obs = await self.agent._search_r1_observation(content, ep)
        else:
            ep.malformed_calls += 1
            obs = SEARCH_R1_INVALID
        ep.transcript.append({"role": "tool", "content": obs, "queries": [content] if action else []})
        return obs


def failure_counts(episodes: Sequence[Episode]) -> Counter[str]:
    """Search failures by kind over many episodes."""
    total: Counter[str] = Counter()
    for ep in episodes:
        total.update(ep.failure_kinds)
    return total


async def run_questions(
    agent: SearchAgent,
    questions: Sequence[str],
    *,
    concurrency: int = 16,
    progress: bool = True,
    on_done: Callable[[int, Episode], None] | None = None,
    refresh_s: float = 1.0,
) -> list[Episode]:
    """Run many episodes with at most `concurrency` in flight; results in input order, a tqdm bar on stderr.

    `on_done(index, episode)` is called as each episode finishes (the evaluator appends it to disk). The first
    exception (a fatal search failure, the LLM gone after its retries) cancels the episodes still running.
    With an engine that counts its tokens as it makes them (the local one: `LocalLLM.tokens_generated`), the
    bar also shows the tokens generated and tokens/s, refreshed every `refresh_s` seconds.
    """
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions), desc="questions", unit="q", disable=not progress)
    tokens = getattr(agent.llm, "tokens_generated", None)  # the local engine counts as it generates
    ticker = (
        asyncio.ensure_future(_show_tokens(bar, tokens, refresh_s)) if progress and callable(tokens) else None
    )

    async def one(i: int, q: str) -> Episode:
        async with sem:
            ep = await agent.run(q)
        if on_done is not None:
            on_done(i, ep)
        bar.update(1)
        return ep

    tasks = [asyncio.ensure_future(one(i, q)) for i, q in enumerate(questions)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        bar.close()


def token_postfix(tokens: int, seconds: float) -> str:
    """The bar's postfix: tokens generated since the bar opened and their rate over that wall time."""
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{tokens:,} tokens, {rate:.1f} tok/s"


async def _show_tokens(bar: Any, tokens: Callable[[], int], every_s: float) -> None:
    """Every `every_s`, the tokens generated so far in the bar: a question on a CPU can take minutes (a model
    rambling to a 4,096-token budget), and a bar counting questions alone sits at 0 all that time."""
    start, t0 = tokens(), time.perf_counter()
    try:
        while True:
            await asyncio.sleep(every_s)
            bar.set_postfix_str(token_postfix(tokens() - start, time.perf_counter() - t0))
    finally:  # cancelled when the questions are done: the bar's last frame carries the totals
        bar.set_postfix_str(token_postfix(tokens() - start, time.perf_counter() - t0))


__all__ = [
    "FATAL_KINDS",
    "STOP_LENGTH",
    "STOP_LLM_ERROR",
    "STOP_RESPONSE_BUDGET",
    "STOP_MALFORMED",
    "STOP_MAX_TURNS",
    "STOP_NO_TOOL_CALL",
    "AgentConfig",
    "Episode",
    "FatalSearchError",
    "SearchAgent",
    "failure_counts",
    "run_questions",
]
