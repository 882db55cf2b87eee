"""`searchrl eval`: run a QA set through the agent and record every answer with the protocol that produced it.

    searchrl eval --model Qwen/Qwen2.5-3B-Instruct --llm-url http://127.0.0.1:30000/v1 \\
        --retrieval-url http://127.0.0.1:8000 --qa searchr1-test --limit 200

QA sources: `dev` (the bundled 30-question dev set over the English Wikipedia subset), `searchr1-test` (the
Search-R1 test parquet, `PeterJinGo/nq_hotpotqa_train` `test.parquet`, ≈51k rows over the seven datasets,
fetched with huggingface_hub), or a path to a `.jsonl` / `.parquet` with `question` and `golden_answers`
(and optionally `id`, `data_source`).

Each question's record is appended to `<output_dir>/<label>-<protocol hash>.jsonl` as it finishes, so a killed
run resumes where it stopped when the same command runs again; a changed protocol gets another hash, hence
another file, never a silent overwrite. At the end `<label>-<hash>.json` holds `protocol` (model, endpoint,
engine, retrieval backend, corpus and index checksums from the service's GET /, the shared rollout rules,
decoding, prompt format, question-set checksum, ...), `summary`, `per_dataset` and one entry per question
(answer, pure EM, shaped reward, F1, searches, failures by kind, turns, stop reason, latency, transcript). EM
and F1 come from `searchrl.scoring`, the scorer the training reward uses; intervals from `searchrl.stats`.

Failures are counted and bounded: a run whose share of questions with a search failure or LLM error passes
`max_failure_rate` (2%), over all questions or within any one dataset, is marked invalid, and `searchrl compare`
refuses it unless told otherwise. What the model causes (malformed calls, calls without a usable query, empty
Search-R1 queries) is reported as model behaviour and never counts against validity. Once failures make the run
invalid whatever the remaining questions give, or the backend fails `max_consecutive_failures` searches in a
row, the run stops and keeps what is done; after the outage `--retry-failed` re-runs only the failed questions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.errors import DataError, InvalidRunError, RetrievalUnavailableError, RunCannotBeValidError
from searchrl.infer.agent import (
    FATAL_KINDS,
    AgentConfig,
    Episode,
    FatalSearchError,
    SearchAgent,
    run_questions,
)
from searchrl.infer.engine import engine_identity, open_engine
from searchrl.infer.journal import open_journal, result_paths, resume, write_result
from searchrl.infer.protocol import build_protocol
from searchrl.infer.qa import QAItem, load_qa
from searchrl.infer.settings import InferSettings
from searchrl.infer.summary import cannot_be_valid, failed, question_key, score_episode, summarize

if TYPE_CHECKING:
    from searchrl.retrieval.client import RetrievalClient

log = logging.getLogger(__name__)


# --- the retrieval service -----------------------------------------------------------------------------------
async def fetch_retrieval_info(
    urls: Sequence[str], api_key: str | None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """What the retrieval service says about itself (GET /): backend, corpus, index and their checksums.

    Also the first half of the fail-fast check: no answering replica or a 401/403 stops the run before any
    generation. `preflight_search` is the second half. Through `RetrievalClient.info()`, so GET / trusts what the
    searches trust ($SEARCHRL_RETRIEVAL_CA_BUNDLE for a `service.tls` endpoint).
    """
    from searchrl.retrieval.client import RetrievalClient

    async with RetrievalClient(urls, api_key=api_key, timeout_s=timeout_s) as client:
        return await client.info()


# GET / counters of a web backend that the report turns into per-run figures (after minus the protocol's before)
SERVICE_COUNTERS = ("page_fetch_failures", "blocked_results")


async def _service_counters_after(settings: InferSettings) -> dict[str, Any]:
    """The service's page-fetch fallbacks and blocked results once the run is over (GET / again).

    They are per replica and since its start: the report subtracts the protocol's GET / from before the run, which
    is exact for one replica (or a list of URLs, both read from the first that answers) and only a sample behind a
    load balancer, where the two reads may reach different replicas (a negative difference is then shown as
    unknown). A service that no longer answers leaves the figures unknown, never the run invalid.
    """
    try:
        after = await fetch_retrieval_info(
            settings.retrieval_urls, settings.retrieval_api_key_value(), settings.retrieval_timeout_s
        )
    except RetrievalUnavailableError as exc:
        log.warning("GET / after the run failed (%s): page-fetch fallbacks and blocked results unknown", exc)
        return {}
    return {k: after[k] for k in ("url", *SERVICE_COUNTERS) if k in after}


async def preflight_search(retrieval: RetrievalClient, topk: int) -> None:
    """One real query through the backend under test: GET / answers even when the web API key is spent."""
    from searchrl.retrieval.client import HEALTH_QUERY

    try:
        hits = await retrieval.search([HEALTH_QUERY], topk)
    except RetrievalUnavailableError as exc:
        hint = FATAL_KINDS.get(exc.kind, "the backend cannot answer a search")
        raise RetrievalUnavailableError(
            f"pre-flight search {HEALTH_QUERY!r} failed: {hint} ({exc})", kind=exc.kind, status=exc.status
        ) from None
    if not hits or not hits[0]:
        raise RetrievalUnavailableError(
            f"pre-flight search {HEALTH_QUERY!r} returned no passages; check the backend's index or API key",
            kind="empty",
        )


# --- running -------------------------------------------------------------------------------------------------
@dataclass
class _Session:
    """One session of a run: the records by question key (resumed ones included) and how it went."""

    json_path: Path
    done: dict[str, dict[str, Any]]
    generated: int = 0  # tokens generated by the questions run in this session (a resume skips the others)
    aborted: str | None = None
    fatal: BaseException | None = None
    gen_s: float = 0.0  # since the engine was up, searches included
    engine: Any = None  # what the local engine says it did inside generate()
    dropped: list[str] = field(default_factory=list)  # pinned fields the server refused by name
    client_stats: Any = None  # per replica: sent, failed by kind, breaker (this session; not the protocol)


def _select_questions(
    settings: InferSettings, items: Sequence[QAItem] | None, qa_path: Path | None
) -> tuple[Sequence[QAItem], Path, list[str]]:
    """The questions to ask (the settings' QA source unless given), their file and their keys."""
    if items is None:
        items, qa_path = load_qa(
            settings.qa, datasets=settings.dataset_filter, limit=settings.limit, seed=settings.sample_seed
        )
    assert qa_path is not None
    keys = [question_key({"data_source": it.data_source, "id": it.id}) for it in items]
    if len(set(keys)) != len(keys):
        raise DataError(f"{qa_path}: question ids repeat within a data source; give every row a unique 'id'")
    return items, qa_path, keys


async def _connect_retrieval(settings: InferSettings) -> tuple[dict[str, Any] | None, RetrievalClient | None]:
    """What the service says about itself and a client that has passed a real search (None without search)."""
    from searchrl.retrieval.client import RetrievalClient

    info = None
    retrieval = None
    if settings.search:  # before loading a model: a dead retrieval service fails the run in a second
        info = await fetch_retrieval_info(
            settings.retrieval_urls, settings.retrieval_api_key_value(), settings.retrieval_timeout_s
        )
        retrieval = RetrievalClient(
            settings.retrieval_urls,
            api_key=settings.retrieval_api_key_value(),
            timeout_s=settings.retrieval_timeout_s,
        )
        try:
            await preflight_search(retrieval, settings.topk)
        except BaseException:
            await retrieval.aclose()
            raise
    return info, retrieval


async def _run_pending(
    settings: InferSettings,
    agent: SearchAgent,
    protocol: dict[str, Any],
    items: Sequence[QAItem],
    keys: Sequence[str],
    *,
    progress: bool,
) -> _Session:
    """Ask the questions the journal does not hold yet, appending each record as it finishes.

    A fatal search failure, or with `stop_when_invalid` failures that make the run invalid whatever follows,
    stop the run: the session says why, and keeps what is done.
    """
    json_path, jsonl_path = result_paths(protocol, settings.output_dir)
    session = _Session(json_path, resume(jsonl_path, protocol, retry_failed=settings.retry_failed))
    done = session.done
    todo = [(k, it) for k, it in zip(keys, items, strict=True) if k not in done]
    if done:
        log.info("resuming %s: %d of %d questions already done", jsonl_path, len(done), len(items))
    planned = Counter(it.data_source for it in items)
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    with open_journal(jsonl_path, protocol, resumed=bool(done)) as append:

        def record(index: int, ep: Episode) -> None:
            key, item = todo[index]
            rec = score_episode(item, ep)
            session.generated += ep.completion_tokens
            done[key] = rec
            append(rec)
            if settings.stop_when_invalid and failed(rec):
                why = cannot_be_valid(list(done.values()), planned, settings.max_failure_rate)
                if why:
                    raise RunCannotBeValidError(why)

        try:
            await run_questions(
                agent,
                [it.question for _, it in todo],
                concurrency=settings.concurrency,
                progress=progress,
                on_done=record,
            )
        except FatalSearchError as exc:
            session.aborted, session.fatal = f"{exc.kind}: {exc}", exc
        except RunCannotBeValidError as exc:
            session.aborted, session.fatal = f"stopped early: {exc}", exc
    return session


async def evaluate(
    settings: InferSettings,
    *,
    items: Sequence[QAItem] | None = None,
    qa_path: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the QA set, appending each question's record as it finishes, and return the result document.

    Re-running the same command resumes: questions already in `<label>-<hash>.jsonl` are skipped (with
    `retry_failed`, failed ones run again). A fatal search failure (quota, 401/403, replay miss, a backend down
    for `max_consecutive_failures` searches) or, with `stop_when_invalid`, failures that make the run invalid
    whatever follows, stop the run; the result file is still written, marked aborted and invalid, and the
    error is raised.
    """
    items, qa_path, keys = _select_questions(settings, items, qa_path)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    info, retrieval = await _connect_retrieval(settings)
    try:
        llm, renderer = await open_engine(settings)
        t_gen = time.perf_counter()
        try:
            protocol = build_protocol(
                settings,
                retrieval_info=info,
                qa_path=qa_path,
                n_questions=len(items),
                chat_template=getattr(renderer.tokenizer, "chat_template", None) if renderer else None,
                model_identity=await asyncio.to_thread(engine_identity, llm),
            )
            agent = SearchAgent(llm, retrieval, AgentConfig.from_settings(settings), renderer)
            session = await _run_pending(settings, agent, protocol, items, keys, progress=progress)
        finally:
            gen_s = time.perf_counter() - t_gen
            engine = getattr(llm, "stats", None)
            dropped = sorted(getattr(llm, "dropped_fields", ()))
            await llm.aclose()
    finally:
        client_stats = retrieval.stats() if retrieval is not None else None
        if retrieval is not None:
            await retrieval.aclose()
    session.gen_s, session.engine, session.dropped = gen_s, engine, dropped
    session.client_stats = client_stats
    questions = [session.done[k] for k in keys if k in session.done]
    summary, per_dataset = summarize(
        questions, max_failure_rate=settings.max_failure_rate, aborted=session.aborted
    )
    if info is not None:
        summary["retrieval_after"] = await _service_counters_after(settings)
    result = _result_document(protocol, summary, per_dataset, questions, session, started=started, t0=t0)
    result["path"] = str(write_result(result, settings.output_dir))
    _log_result(result)
    _raise_if_stopped(session, len(questions), len(items))
    return result


def _result_document(
    protocol: dict[str, Any],
    summary: dict[str, Any],
    per_dataset: dict[str, Any],
    questions: list[dict[str, Any]],
    session: _Session,
    *,
    started: datetime,
    t0: float,
) -> dict[str, Any]:
    """The result file's content: the protocol plus what running taught, the summary plus this session's figures."""
    # throughput of this session: generated tokens over the time since the engine was up (searches included);
    # the local engine also says what it did inside generate() (batches, tokens/s of model time)
    summary["generated_tokens"] = session.generated
    summary["tokens_per_s"] = round(session.generated / session.gen_s, 2) if session.gen_s > 0 else 0.0
    if session.engine is not None and hasattr(session.engine, "as_dict"):
        summary["engine"] = session.engine.as_dict()
    if session.dropped:  # the server refused these pinned fields by name; its defaults applied to them
        protocol["decoding_dropped_by_server"] = session.dropped
    protocol["started_at"] = started.isoformat(timespec="seconds")
    protocol["wall_s"] = round(time.perf_counter() - t0, 3)
    result = {"protocol": protocol, "summary": summary, "per_dataset": per_dataset, "questions": questions}
    if session.client_stats is not None:  # per replica: sent, failed by kind, breaker (not the protocol)
        from searchrl.retrieval.client import summarize_client_stats

        result["retrieval_client"] = session.client_stats
        log.info("retrieval client: %s", summarize_client_stats(session.client_stats))
    return result


def _log_result(result: dict[str, Any]) -> None:
    protocol, summary = result["protocol"], result["summary"]
    log.info(
        "%s: %d questions, EM %.3f [%.3f, %.3f], %d search failures, %d LLM errors, %s in %.1fs (%.1f tok/s)",
        protocol["label"],
        len(result["questions"]),
        summary["em"],
        *summary["em_ci"],
        summary["search_failures"],
        summary["llm_errors"],
        "valid" if summary["valid"] else f"INVALID ({summary['invalid_reason']})",
        protocol["wall_s"],
        summary["tokens_per_s"],
    )


def _raise_if_stopped(session: _Session, n_done: int, n_items: int) -> None:
    """A stopped run raises once its result file is written, saying how to go on."""
    fatal, json_path = session.fatal, session.json_path
    if isinstance(fatal, RunCannotBeValidError):
        raise InvalidRunError(
            f"run stopped early, it can no longer be valid: {fatal}; {n_done} of {n_items} questions "
            f"are in {json_path}; once the backend is healthy re-run the same command with --retry-failed"
        ) from fatal
    if fatal is not None:
        raise RetrievalUnavailableError(
            f"run stopped: {fatal}; {n_done} of {n_items} questions are in {json_path} (marked "
            "invalid); fix the cause and re-run the same command to resume (add --retry-failed to re-run "
            "the failed ones)",
            kind=getattr(fatal, "kind", "fatal"),
        ) from fatal


def run_eval(settings: InferSettings, *, progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Evaluate (resuming a killed run of the same protocol) and write `<output_dir>/<label>-<hash>.json`."""
    result = asyncio.run(evaluate(settings, progress=progress))
    return Path(result.pop("path")), result


__all__ = [
    "SERVICE_COUNTERS",
    "InvalidRunError",
    "RunCannotBeValidError",
    "evaluate",
    "fetch_retrieval_info",
    "preflight_search",
    "run_eval",
]
