"""End-to-end smoke test of a corpus: download, serve, health, recall, eval: what CI's `smoke-100k` job runs.

    searchrl smoke                                     # bundled corpus, bm25: runs offline (make smoke)
    searchrl smoke --corpus wiki18-100k --backend dense --encoder intfloat/e5-base-v2 --require-download

Every step runs the real thing a user runs: `searchrl index download`, the `searchrl serve` process on a free
loopback port, `searchrl health`'s check, and `/retrieve` over HTTP for the recall questions. Recall is scored
by title, as `searchrl index recall` does (DESIGN.md 5): on a QA file with `supporting_titles` when one is given
(the bundled corpus defaults to the dev set), else on known-item questions drawn from the corpus itself (a
sentence of a passage must find its article in the top k), which works for any corpus, wiki18-100k included.

The last step runs `searchrl eval` (a subprocess, the production CLI) on the first `eval_questions` of those
questions against the served index, with a SCRIPTED model (`python -m searchrl.infer.scripted`: an
OpenAI-compatible server that searches for the question, then answers with the first passage's title). It is a
check of the pipeline, never a model result: the golden answers are the supporting titles, so its EM is the
index's recall@1, and the step fails on any search failure, LLM error, malformed tool call or unparsable answer.

When the Hugging Face Hub cannot be reached (this repo's development machines), a named corpus is skipped with
one line saying so and exit 0; `--require-download` (set in CI, where the Hub is reachable) makes that a failure.
Nothing is ever faked: a skipped step is reported as skipped, never as passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from searchrl.devset import dev_qa_path
from searchrl.errors import RetrievalUnavailableError, SearchRLError
from searchrl.processes import stop_process
from searchrl.retrieval.process import free_port, served, start_process, wait_until_ready

log = logging.getLogger(__name__)

DEFAULT_QA = dev_qa_path()
EVAL_LABEL = "scripted pipeline check (not a model)"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@dataclass
class Step:
    name: str
    status: str  # passed | failed | skipped
    seconds: float
    detail: str


@dataclass
class SmokeReport:
    corpus: str
    backend: str
    steps: list[Step] = field(default_factory=list)
    recall: float | None = None
    questions: int = 0
    eval: dict[str, Any] | None = (
        None  # the scripted-model eval's counts (pipeline check, not a model result)
    )

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    def table(self) -> str:
        lines = ["| step | status | seconds | detail |", "|---|---|---:|---|"]
        lines += [f"| {s.name} | {s.status} | {s.seconds:.1f} | {s.detail} |" for s in self.steps]
        return "\n".join(lines)


@dataclass(frozen=True)
class Question:
    text: str
    titles: tuple[str, ...]


def hub_reachable(timeout_s: float = 10.0) -> tuple[bool, str]:
    """Whether the Hugging Face Hub (or HF_ENDPOINT) answers at all; any HTTP status counts as reachable."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        httpx.head(endpoint + "/api/datasets", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"{endpoint} ({type(exc).__name__})"
    return True, endpoint


def qa_questions(path: Path) -> list[Question]:
    """Questions with supporting titles, from a QA JSONL (the format `searchrl index recall` reads)."""
    from searchrl.retrieval.index.recall import load_qa

    return [Question(r.question, r.supporting_titles) for r in load_qa(path)]


def known_item_questions(corpus_path: Path, n: int) -> list[Question]:
    """`n` passages spread evenly over the corpus (streamed: wiki-18 does not fit in memory); each question is
    a sentence of the passage (its second when it has one: the first often repeats the title) and the answer
    is the passage's article title."""
    from searchrl.retrieval.corpus import count_rows, iter_passages

    total = count_rows(corpus_path)
    if total == 0:
        raise SearchRLError(f"corpus {corpus_path} has no passages")
    stride = max(1, total // n)
    questions: list[Question] = []
    for i, passage in enumerate(iter_passages(corpus_path)):
        if len(questions) == n:
            break
        if i % stride:
            continue
        sentences = [s for s in _SENTENCE_END.split(passage.text.strip()) if len(s.split()) >= 6]
        if sentences:
            sentence = sentences[1] if len(sentences) > 1 else sentences[0]
            questions.append(Question(" ".join(sentence.split()[:30]), (passage.title,)))
    return questions


def score(questions: Sequence[Question], titles_per_question: Sequence[Sequence[str]]) -> float:
    hits = sum(
        any(t in set(got) for t in q.titles) for q, got in zip(questions, titles_per_question, strict=True)
    )
    return hits / len(questions)


async def _search_titles(url: str, questions: Sequence[Question], k: int) -> list[list[str]]:
    from searchrl.retrieval.client import RetrievalClient

    client = RetrievalClient(url, os.environ.get("RETRIEVAL_API_KEY") or None, timeout_s=60.0)
    try:
        out: list[list[str]] = []
        for start in range(0, len(questions), 32):
            batch = questions[start : start + 32]
            hits = await client.search([q.text for q in batch], k)
            out += [[h.title for h in per_query] for per_query in hits]
        return out
    finally:
        await client.aclose()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(text[-lines:])


@contextlib.contextmanager
def scripted_model(log_path: Path, deadline_s: float = 60.0) -> Iterator[str]:
    """`python -m searchrl.infer.scripted` on a free loopback port; yields its OpenAI base URL (`.../v1`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "searchrl.infer.scripted", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    proc = start_process(cmd, log_path)
    try:
        try:
            wait_until_ready(url, proc, timeout_s=deadline_s, interval_s=0.2, request_timeout_s=2.0)
        except SearchRLError as exc:
            raise SearchRLError(f"the scripted model did not start ({exc}): {_tail(log_path)}") from exc
        yield url + "/v1"
    finally:
        stop_process(proc)


def write_eval_qa(questions: Sequence[Question], path: Path) -> Path:
    """The eval's QA file: each question with its supporting titles as the golden answers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": str(i), "question": q.text, "golden_answers": list(q.titles), "data_source": "smoke"}
        for i, q in enumerate(questions)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def eval_counts(result: dict[str, Any]) -> dict[str, Any]:
    """What the smoke report keeps of an eval result: every way a question can have gone wrong, and EM."""
    summary, rows = result["summary"], result["questions"]
    return {
        "questions": len(rows),
        "searched": sum(int(r.get("searches", 0)) > 0 for r in rows),
        "searches": sum(int(r.get("searches", 0)) for r in rows),
        "search_failures": int(summary.get("search_failures", 0)),
        "failure_kinds": dict(summary.get("failure_kinds") or {}),
        "llm_errors": int(summary.get("llm_errors", 0)),
        "malformed_calls": sum(int(r.get("malformed_calls", 0)) for r in rows),
        "unparsed_answers": sum(not r.get("format_valid") for r in rows),
        "stop_reasons": dict(summary.get("stop_reasons") or {}),
        "em": float(summary.get("em", 0.0)),
        "valid": bool(summary.get("valid", False)),
    }


def eval_problems(counts: dict[str, Any], expected: int) -> list[str]:
    """Why a scripted eval run does not prove the pipeline (empty: it does)."""
    problems = []
    if counts["questions"] != expected:
        problems.append(f"{counts['questions']} of {expected} questions recorded")
    if counts["searched"] != counts["questions"]:
        problems.append(f"{counts['questions'] - counts['searched']} questions never searched")
    if counts["search_failures"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(counts["failure_kinds"].items()))
        problems.append(f"{counts['search_failures']} search failures ({kinds})")
    if counts["llm_errors"]:
        problems.append(f"{counts['llm_errors']} LLM errors")
    if counts["malformed_calls"]:
        problems.append(f"{counts['malformed_calls']} malformed tool calls")
    if counts["unparsed_answers"]:
        problems.append(f"{counts['unparsed_answers']} unparsable answers")
    if not counts["valid"] and not problems:
        problems.append("the eval marked its run invalid")
    return problems


def run_eval_step(
    url: str, questions: Sequence[Question], top1: Sequence[Sequence[str]], k: int, out_dir: Path
) -> tuple[Step, dict[str, Any] | None]:
    """`searchrl eval` with the scripted model against `url`, as a user runs it; the step and the counts."""
    from searchrl.infer.scripted import PIPELINE_CHECK_MODEL

    started = time.monotonic()
    eval_dir = out_dir / "eval"
    shutil.rmtree(
        eval_dir, ignore_errors=True
    )  # a leftover run of the same protocol would be resumed, not re-run
    qa = write_eval_qa(questions, eval_dir / "qa.jsonl")
    results = eval_dir / "results"
    try:
        with scripted_model(eval_dir / "scripted-model.log") as llm_url:
            cmd = [
                sys.executable, "-m", "searchrl", "eval",
                "--model", PIPELINE_CHECK_MODEL, "--llm-url", llm_url, "--api", "chat",
                "--retrieval-url", url, "--qa", str(qa), "--topk", str(k),
                "--label", EVAL_LABEL, "--output-dir", str(results),
            ]  # fmt: skip
            env = {**os.environ, "SEARCHRL_INFER_LLM_MAX_RETRIES": "2"}  # the token stays in the environment
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    except (SearchRLError, subprocess.TimeoutExpired) as exc:
        return Step("eval (scripted model)", "failed", time.monotonic() - started, str(exc)), None
    (eval_dir / "eval.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    found = sorted(results.glob("*.json"))
    if proc.returncode != 0 and not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        detail = f"searchrl eval exited {proc.returncode}: {last}"
        return Step("eval (scripted model)", "failed", time.monotonic() - started, detail), None
    counts = eval_counts(json.loads(found[-1].read_text(encoding="utf-8")))
    recall1 = score(questions, [t[:1] for t in top1])
    counts.update(result=str(found[-1]), recall_at_1=recall1, exit_code=proc.returncode)
    problems = eval_problems(counts, len(questions))
    if proc.returncode != 0 and not problems:
        problems.append(f"searchrl eval exited {proc.returncode}")
    detail = (
        f"pipeline check, NOT a model result: {counts['questions']} questions, {counts['searches']} searches, "
        f"{counts['search_failures']} search failures, {counts['llm_errors']} LLM errors, "
        f"{counts['malformed_calls']} malformed tool calls, {counts['unparsed_answers']} unparsable answers; "
        f"EM {counts['em']:.3f} (answers are the top passage's title: recall@1 over /retrieve is {recall1:.3f})"
    )
    if problems:
        detail = f"{'; '.join(problems)}. {detail}"
    status = "failed" if problems else "passed"
    return Step("eval (scripted model)", status, time.monotonic() - started, detail), counts


def run_smoke(
    *,
    corpus: str = "bundled",
    backend: str = "bm25",
    encoder: str | None = None,
    data_dir: Path = Path("data"),
    qa: Path | None = None,
    questions: int = 20,
    k: int = 3,
    min_recall: float = 0.6,
    eval_questions: int = 10,
    require_download: bool = False,
    start_deadline_s: float = 900.0,
    out_dir: Path = Path("outputs/smoke"),
) -> SmokeReport:
    """Run the steps in order; a failed step ends the run (later steps are not attempted)."""
    from searchrl.config import load_settings
    from searchrl.retrieval.client import check_health
    from searchrl.retrieval.index.build import resolve_corpus
    from searchrl.retrieval.index.download import CORPORA, INDEXES, download_corpus
    from searchrl.retrieval.index.prebuilt import download_index
    from searchrl.retrieval.settings import RetrievalSettings

    report = SmokeReport(corpus, backend)
    # a bad --backend (or corpus) is a ConfigError naming the knob, not pydantic's traceback
    settings = load_settings(RetrievalSettings, backend=backend, corpus=corpus, data_dir=data_dir)

    started = time.monotonic()
    if corpus in CORPORA:
        reachable, where = hub_reachable()
        if not reachable:
            detail = f"Hub unreachable: {where}; nothing was downloaded, served or scored"
            status = "failed" if require_download else "skipped"
            report.steps.append(Step("download", status, time.monotonic() - started, detail))
            return report
        # a name with a prebuilt index brings its corpus along; bm25 only needs the corpus
        if corpus in INDEXES and backend == "dense":
            fetched = download_index(corpus, settings)
        else:
            fetched = download_corpus(corpus, Path(data_dir))
        report.steps.append(Step("download", "passed", time.monotonic() - started, fetched.name))
    else:
        report.steps.append(Step("download", "skipped", 0.0, f"{corpus}: nothing to download"))

    serve_args = ["--backend", backend, "--corpus", corpus, "--data-dir", str(data_dir)]
    if encoder:
        serve_args += ["--encoder", encoder]
    log_path = out_dir / "serve.log"
    with served(serve_args, log_path) as url:
        started = time.monotonic()
        health = check_health(url, os.environ.get("RETRIEVAL_API_KEY"), deadline_s=start_deadline_s)
        seconds = time.monotonic() - started
        if not health.ok:
            detail = f"{health.reason}; serve log: {_tail(log_path)}"
            report.steps.append(Step("serve + health", "failed", seconds, detail))
            return report
        report.steps.append(Step("serve + health", "passed", seconds, f"{url}: {health.reason}"))

        started = time.monotonic()
        if qa is None and corpus == "bundled":
            qa = DEFAULT_QA
        if qa is not None:
            qs, kind = qa_questions(qa), f"QA file {qa}"
        else:
            qs, kind = known_item_questions(resolve_corpus(settings), questions), "known-item questions"
        try:
            titles = asyncio.run(_search_titles(url, qs, k))
        except RetrievalUnavailableError as exc:
            report.steps.append(Step("recall", "failed", time.monotonic() - started, str(exc)))
            return report
        report.recall, report.questions = score(qs, titles), len(qs)
        status = "passed" if report.recall >= min_recall else "failed"
        detail = f"recall@{k} {report.recall:.3f} on {len(qs)} questions ({kind}; floor {min_recall})"
        report.steps.append(Step("recall", status, time.monotonic() - started, detail))
        if status == "failed":
            return report

        if eval_questions <= 0:
            report.steps.append(Step("eval (scripted model)", "skipped", 0.0, "--eval-questions 0"))
            return report
        step, report.eval = run_eval_step(url, qs[:eval_questions], titles[:eval_questions], k, out_dir)
        report.steps.append(step)
    return report


def write_report(report: SmokeReport, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "smoke.json"
    path.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n")
    return path


__all__ = [
    "EVAL_LABEL",
    "Question",
    "SmokeReport",
    "Step",
    "eval_counts",
    "eval_problems",
    "hub_reachable",
    "known_item_questions",
    "run_eval_step",
    "run_smoke",
    "score",
    "scripted_model",
    "write_eval_qa",
]
