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
import hashlib
import json
import logging
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl import __version__
from searchrl.devset import dev_qa_path
from searchrl.errors import (
    DataError,
    InvalidRunError,
    RetrievalUnavailableError,
    RunCannotBeValidError,
)
from searchrl.infer.agent import (
    FATAL_KINDS,
    STOP_LLM_ERROR,
    AgentConfig,
    Episode,
    FatalSearchError,
    SearchAgent,
    run_questions,
)
from searchrl.infer.llm import PINNED_DECODING, ChatRenderer, ServerLLM, TextGenerator, load_tokenizer
from searchrl.infer.settings import InferSettings
from searchrl.prompt import POLICY_FAILURES, prompt_version
from searchrl.scoring import score_response
from searchrl.stats import bootstrap_ci, proportion_ci

if TYPE_CHECKING:
    from searchrl.retrieval.client import RetrievalClient

log = logging.getLogger(__name__)

SEARCHR1_REPO = "PeterJinGo/nq_hotpotqa_train"
SEARCHR1_TEST_FILE = "test.parquet"
# Column order of the paper's table (arXiv 2503.09516, Table 2); other data sources follow alphabetically.
PAPER_ORDER = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    golden_answers: list[str]
    data_source: str = "dev"


# --- QA data -------------------------------------------------------------------------------------------------
def _clean_source(value: Any, default: str) -> str:
    text = str(value or default)
    return text.removeprefix("searchR1_")


def _as_str_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [str(v) for v in value]


def _question_from_prompt(prompt: Any) -> str | None:
    """Search-R1 parquet rows carry the full prompt; the question follows its last 'Question:'."""
    msgs = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if not msgs:
        return None
    content = str(msgs[-1].get("content", "")) if isinstance(msgs[-1], dict) else str(msgs[-1])
    if "Question:" not in content:
        return None
    return content.rsplit("Question:", 1)[1].strip()


def _row_to_item(row: dict[str, Any], where: str, default_source: str) -> QAItem:
    question = row.get("question")
    if not question and row.get("prompt") is not None:
        question = _question_from_prompt(row["prompt"])
    golden = _as_str_list(row.get("golden_answers"))
    if not golden:
        rm = row.get("reward_model") or {}
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        golden = _as_str_list(gt.get("target") if isinstance(gt, dict) else gt)
    if not question or not golden:
        raise DataError(f"{where}: a QA row needs a non-empty 'question' and 'golden_answers'")
    source = _clean_source(row.get("data_source"), default_source)
    return QAItem(
        id=str(row.get("id") or where), question=str(question), golden_answers=golden, data_source=source
    )


def _load_jsonl(path: Path) -> list[QAItem]:
    items = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
            items.append(_row_to_item(row, f"{path}:{lineno}", "dev"))
    return items


def _load_parquet(path: Path) -> list[QAItem]:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read parquet ({exc})") from exc
    return [_row_to_item(row, f"{path}:row {i}", "qa") for i, row in enumerate(df.to_dict(orient="records"))]


def resolve_qa_path(source: str) -> Path:
    """The file behind a QA source name (downloading the Search-R1 test set when asked)."""
    if source == "dev":
        path = dev_qa_path()
        if path.is_file():
            return path
        raise DataError(f"the bundled dev set ({path}) is missing from this install; pass --qa <path.jsonl>")
    if source == "searchr1-test":
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(SEARCHR1_REPO, SEARCHR1_TEST_FILE, repo_type="dataset"))
        except Exception as exc:  # network, auth, missing file: all mean "cannot get the data"
            raise DataError(
                f"cannot download {SEARCHR1_REPO}/{SEARCHR1_TEST_FILE} ({exc.__class__.__name__}); "
                "download it elsewhere and pass --qa <path>.parquet"
            ) from exc
    path = Path(source)
    if not path.exists():
        raise DataError(f"QA file {source!r} not found; use dev, searchr1-test or a .jsonl/.parquet path")
    return path


def load_qa(
    source: str, *, datasets: Sequence[str] | None = None, limit: int | None = None, seed: int = 0
) -> tuple[list[QAItem], Path]:
    """QA items from a source, filtered to `datasets` and sampled to `limit` per dataset (order kept)."""
    path = resolve_qa_path(source)
    items = _load_parquet(path) if path.suffix == ".parquet" else _load_jsonl(path)
    if datasets:
        known = sorted({i.data_source for i in items})
        missing = [d for d in datasets if d not in known]
        if missing:
            raise DataError(f"no rows with data_source {missing} in {path}; it has {known}")
        items = [i for i in items if i.data_source in set(datasets)]
    if limit is not None:
        by_source: dict[str, list[int]] = defaultdict(list)
        for idx, it in enumerate(items):
            by_source[it.data_source].append(idx)
        keep: set[int] = set()
        for source, idxs in by_source.items():
            # One generator per dataset, seeded by its name: a run split by dataset draws the same questions.
            rng = random.Random(f"{seed}:{source}")
            keep.update(idxs if len(idxs) <= limit else rng.sample(idxs, limit))
        items = [it for idx, it in enumerate(items) if idx in keep]
    if not items:
        raise DataError(f"no QA rows selected from {path}")
    return items, path


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- scoring and aggregation ----------------------------------------------------------------------------------
def question_key(record: dict[str, Any]) -> str:
    """What identifies a question across runs and resumes."""
    return f"{record['data_source']}/{record['id']}"


def score_episode(item: QAItem, ep: Episode) -> dict[str, Any]:
    """One question's record in a result file: `em` is pure EM (the paper's), `reward` the shaped score."""
    s = score_response(ep.response, item.golden_answers)
    return {
        "id": item.id,
        "data_source": item.data_source,
        "question": item.question,
        "golden_answers": item.golden_answers,
        "answer": s.answer,
        "em": s.em_pure,
        "reward": s.em,
        "f1": s.f1,
        "format_valid": s.format_valid,
        "searches": ep.searches,
        "queries": ep.queries,
        "search_failures": ep.search_failures,
        "failure_kinds": ep.failure_kinds,
        "model_errors": ep.model_errors,
        "malformed_calls": ep.malformed_calls,
        "answer_in_observation": answer_in_observation(ep.transcript, item.golden_answers),
        "dropped_calls": ep.dropped_calls,
        "length_truncated_turns": ep.length_truncated_turns,
        "turns": ep.turns,
        "stop_reason": ep.stop_reason,
        "error": ep.error,
        "prompt_tokens": ep.prompt_tokens,
        "response_tokens": ep.response_tokens,
        "completion_tokens": ep.completion_tokens,
        "latency_s": round(ep.latency_s, 4),  # model + search time, without waits for the engine
        "model_s": round(ep.model_s, 4),
        "wall_s": round(ep.wall_s, 4),  # waits for a free engine slot included
        "response": ep.response,
        "transcript": ep.transcript,
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def answer_in_observation(transcript: Sequence[dict[str, Any]], golden: Sequence[str]) -> bool:
    """Whether a tool observation holds a gold answer verbatim (case-insensitive): a leak, or a good search.

    Web results can quote the dataset itself (mirrors, Q&A sites); the share of such questions, beside the
    question's EM, shows how much of a web run is lookup. Search-R1 observations sit in the assistant turns.
    """
    texts = [str(m.get("content") or "").lower() for m in transcript if m.get("role") == "tool"]
    answers = [g.strip().lower() for g in golden if g and g.strip()]
    return any(a in t for t in texts for a in answers)


def service_failures(record: dict[str, Any]) -> int:
    """Failed searches the service caused (older files counted the model's own in `failure_kinds` too)."""
    kinds = record.get("failure_kinds") or {}
    if not kinds:
        return int(record.get("search_failures", 0))
    return sum(int(n) for k, n in kinds.items() if k not in POLICY_FAILURES)


def model_error_counts(record: dict[str, Any]) -> Counter[str]:
    """What the model did wrong in one question, by kind: malformed calls plus POLICY_FAILURES kinds."""
    out: Counter[str] = Counter({k: int(n) for k, n in (record.get("model_errors") or {}).items()})
    for k, n in (record.get("failure_kinds") or {}).items():  # files written before model_errors existed
        if k in POLICY_FAILURES:
            out[k] += int(n)
    if record.get("malformed_calls"):
        out["malformed_call"] += int(record["malformed_calls"])
    return out


def failed(record: dict[str, Any]) -> bool:
    """A question whose number cannot be trusted: the service failed a search, or the LLM rejected a request.

    What the model causes (POLICY_FAILURES, malformed calls) is its behaviour, scored as it comes.
    """
    return service_failures(record) > 0 or record.get("stop_reason") == STOP_LLM_ERROR


def _stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    em = [float(r["em"]) for r in rows]
    f1 = [float(r["f1"]) for r in rows]
    bad = [failed(r) for r in rows]
    ok_em = [e for e, b in zip(em, bad, strict=True) if not b]
    model_errors: Counter[str] = Counter()
    for r in rows:
        model_errors.update(model_error_counts(r))
    return {
        "n": len(rows),
        "em": _mean(em),
        "em_ci": list(proportion_ci(em)),  # Wilson: EM is 0/1, and the bootstrap collapses at 30/30
        "f1": _mean(f1),
        "f1_ci": list(bootstrap_ci(f1)),
        "reward": _mean([float(r.get("reward", r["em"])) for r in rows]),
        "searches": _mean([r["searches"] for r in rows]),
        "turns": _mean([r["turns"] for r in rows]),
        "format_valid": _mean([float(r["format_valid"]) for r in rows]),
        "latency_s": _mean([r["latency_s"] for r in rows]),  # model + search time per question
        "wall_s": _mean([float(r.get("wall_s", r["latency_s"])) for r in rows]),  # waits for the engine too
        "failure_rate": _mean([float(b) for b in bad]),
        # failed/n, and EM both ways: failed questions scored 0, and over the questions that did not fail
        "failed": sum(bad),
        "em_failed_as_zero": _mean([0.0 if b else e for e, b in zip(em, bad, strict=True)]),
        "n_ok": len(ok_em),
        "em_ok": _mean(ok_em) if ok_em else None,
        # the model's own mistakes (never against validity): kinds summed, questions with any
        "model_errors": dict(model_errors),
        "questions_with_model_errors": sum(1 for r in rows if model_error_counts(r)),
        "answer_in_observation": sum(1 for r in rows if r.get("answer_in_observation")),
    }


def dataset_order(sources: Sequence[str]) -> list[str]:
    """Data sources in the paper's column order, unknown ones after it alphabetically."""
    uniq = set(sources)
    return [d for d in PAPER_ORDER if d in uniq] + sorted(uniq - set(PAPER_ORDER))


def summarize(
    questions: Sequence[dict[str, Any]], *, max_failure_rate: float = 0.02, aborted: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, per_dataset). `em_avg` is the unweighted mean over datasets, as the paper's 'Avg.' column.

    The summary counts every way a number can be wrong (search failures by kind, LLM errors, length-cut
    turns, stop reasons) and marks the run invalid when the share of questions with a failure passes
    `max_failure_rate`, or when the run was aborted.
    """
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for q in questions:
        groups[q["data_source"]].append(q)
    per_dataset = {ds: _stats(groups[ds]) for ds in dataset_order(list(groups))}
    summary = _stats(questions)
    summary["em_avg"] = _mean([v["em"] for v in per_dataset.values()])
    summary["stop_reasons"] = dict(Counter(q["stop_reason"] for q in questions))
    summary["llm_errors"] = sum(1 for q in questions if q["stop_reason"] == STOP_LLM_ERROR)
    summary["errors"] = summary["llm_errors"]
    summary["search_failures"] = sum(service_failures(q) for q in questions)
    kinds: Counter[str] = Counter()
    for q in questions:
        kinds.update({k: n for k, n in (q.get("failure_kinds") or {}).items() if k not in POLICY_FAILURES})
    summary["failure_kinds"] = dict(kinds)
    summary["questions_failed"] = sum(1 for q in questions if failed(q))
    summary["length_truncated_turns"] = sum(int(q.get("length_truncated_turns", 0)) for q in questions)
    summary["dropped_calls"] = sum(int(q.get("dropped_calls", 0)) for q in questions)
    summary["max_failure_rate"] = max_failure_rate
    summary["aborted"] = aborted
    problems = []
    if aborted:
        problems.append(f"aborted: {aborted}")
    if summary["failure_rate"] > max_failure_rate:
        problems.append(
            f"{summary['questions_failed']}/{summary['n']} questions ({summary['failure_rate']:.1%}) had a search "
            f"failure or LLM error, above the {max_failure_rate:.1%} limit"
        )
    # An outage hits the questions running at the time, which run in file order: one dataset. The gate applies
    # to each dataset too, so 26 failed of 125 do not hide among 1,325.
    invalid_datasets = [ds for ds, v in per_dataset.items() if v["failure_rate"] > max_failure_rate]
    for ds in invalid_datasets if len(per_dataset) > 1 else []:
        v = per_dataset[ds]
        problems.append(
            f"{ds}: {v['failed']}/{v['n']} questions ({v['failure_rate']:.1%}) failed, above the "
            f"{max_failure_rate:.1%} limit"
        )
    summary["invalid_datasets"] = invalid_datasets
    summary["valid"] = not problems
    summary["invalid_reason"] = "; ".join(problems) or None
    return summary, per_dataset


def cannot_be_valid(
    records: Sequence[dict[str, Any]], planned: dict[str, int], max_failure_rate: float
) -> str | None:
    """Why the run is invalid whatever its remaining questions give, or None while it still can be valid.

    `planned` is the number of questions per dataset the run will have; the gate is `summarize`'s, applied
    to the failures so far over the final counts.
    """
    by_source: Counter[str] = Counter(r["data_source"] for r in records if failed(r))
    total, n = sum(by_source.values()), sum(planned.values())
    if n and total / n > max_failure_rate:
        return f"{total} of {n} questions failed already, above the {max_failure_rate:.1%} limit"
    for ds, k in by_source.items():
        if planned.get(ds) and k / planned[ds] > max_failure_rate:
            return f"{ds}: {k} of its {planned[ds]} questions failed already, above the {max_failure_rate:.1%} limit"
    return None


def _ci(v: dict[str, Any], key: str = "em") -> str:
    lo, hi = v.get(f"{key}_ci") or (None, None)
    if lo is None or lo != lo:  # missing or nan
        return f"{v[key]:.3f}"
    return f"{v[key]:.3f} [{lo:.2f}, {hi:.2f}]"


def model_error_cell(summary: dict[str, Any]) -> str:
    """`4 (bad_arguments 3, malformed_call 1)`-style count of the model's own mistakes (not failures)."""
    kinds = summary.get("model_errors") or {}
    if not kinds:
        return "0"
    return f"{sum(kinds.values())} (" + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")"


def failure_cell(summary: dict[str, Any]) -> str:
    """`3 (connect 2, http_503 1)`-style count of search failures by kind."""
    kinds = summary.get("failure_kinds") or {}
    total = int(summary.get("search_failures", 0))
    if not kinds:
        return str(total)
    return f"{total} (" + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")"


def paper_table(runs: Sequence[dict[str, Any]]) -> str:
    """Markdown table like the paper's (pure EM with 95% intervals, n per dataset) plus the failure columns."""
    sources = dataset_order([ds for r in runs for ds in r["per_dataset"]])
    head = [
        "run",
        *[f"{ds} EM (n)" for ds in sources],
        "avg EM",
        "F1",
        "reward",
        "searches/q",
        "format ok",
        "search failures",
        "model errors",
        "LLM errors",
        "length-cut turns",
        "stop reasons",
        "valid",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in runs:
        s = r["summary"]
        cells = [run_label(r).replace("|", "\\|")]
        for ds in sources:
            v = r["per_dataset"].get(ds)
            failed_here = f", {v['failed']} failed" if v and v.get("failed") else ""
            cells.append(f"{_ci(v)} ({v['n']}{failed_here})" if v else "")
        cells += [
            f"{s['em_avg']:.3f}",
            _ci(s, "f1") if "f1_ci" in s else f"{s['f1']:.3f}",
            f"{s.get('reward', s['em']):.3f}",
            f"{s['searches']:.2f}",
            f"{s['format_valid']:.0%}",
            failure_cell(s),
            model_error_cell(s),
            str(s.get("llm_errors", s.get("errors", 0))),
            str(s.get("length_truncated_turns", 0)),
            ", ".join(f"{k} {v}" for k, v in sorted((s.get("stop_reasons") or {}).items())),
            "yes" if s.get("valid", True) else f"**NO**: {s.get('invalid_reason')}",
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") if i else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def run_label(run: dict[str, Any]) -> str:
    return str(run["protocol"]["label"])


def default_label(settings: InferSettings, backend: str) -> str:
    """`model, backend, search|no-search`, then what else sets one run of a model apart from another: a prompt
    format other than searchrl, and the repo's chat template in place of the model's (`searchrl compare` needs
    one label per run)."""
    model = settings.model.rstrip("/").split("/")[-1]
    parts = [model, backend if settings.search else "none", "search" if settings.search else "no-search"]
    if settings.prompt_format != "searchrl":
        parts.append(f"{settings.prompt_format} format")
    if settings.chat_template != "model":
        parts.append(f"{settings.chat_template} template")
    return ", ".join(parts)


def slugify(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-").lower() or "run"


# --- protocol ------------------------------------------------------------------------------------------------
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


def _checksums(info: Any, prefix: str = "") -> dict[str, Any]:
    """Every field of GET / that names a checksum/hash (corpus_sha256, index_checksum, ...), flattened."""
    out: dict[str, Any] = {}
    if isinstance(info, dict):
        for k, v in info.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(_checksums(v, key + "."))
            elif any(t in k.lower() for t in ("sha", "checksum", "hash", "fingerprint")):
                out[key] = v
    return out


# GET / fields that decide what a search returns (web: provider, page mode, locale, blocklist; index: corpus
# and index checksums, encoder; hybrid: RRF settings and each part, nested). Counters and URLs are left out.
_IDENTITY_KEYS = (
    "backend",
    "provider",
    "engine",
    "page_mode",
    "gl",
    "hl",
    "blocklist_sha256",
    "corpus",
    "corpus_checksum",
    "corpus_sha256",
    "index_type",
    "index_fingerprint",
    "index_checksum",
    "encoder",
    "rrf_k",
    "weights",
    "depth",
)


def retrieval_identity(info: Any) -> dict[str, Any]:
    """What identifies the results a retrieval service returns, from its GET /, with hybrid parts nested.

    Part of the protocol hash: changing the web provider, page mode or locale, or a hybrid part's index,
    gives another hash and another result file, never a resume into the old one.
    """
    if not isinstance(info, dict):
        return {}
    out: dict[str, Any] = {k: info[k] for k in _IDENTITY_KEYS if info.get(k) is not None}
    if isinstance(info.get("parts"), list):
        out["parts"] = [retrieval_identity(p) for p in info["parts"]]
    return out


# Fields of the protocol that do not change what is measured: where things ran, when, and the run's name.
_UNHASHED = {
    "label",
    "endpoint",
    "started_at",
    "wall_s",
    "searchrl_version",
    "protocol_hash",
    "max_failure_rate",
    "decoding_dropped_by_server",  # learnt while running; the same server drops the same fields again
}


def protocol_hash(protocol: dict[str, Any]) -> str:
    """sha256 (first 10 hex) of what decides the numbers: model, rules, decoding, retrieval, question set."""
    core = {k: v for k, v in protocol.items() if k not in _UNHASHED}
    retrieval = dict(core.get("retrieval") or {})
    retrieval.pop("urls", None)
    retrieval.pop("info", None)
    core["retrieval"] = retrieval
    qa = dict(core.get("qa") or {})
    qa.pop("path", None)
    core["qa"] = qa
    blob = json.dumps(core, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def build_protocol(
    settings: InferSettings,
    *,
    retrieval_info: dict[str, Any] | None,
    qa_path: Path,
    n_questions: int,
    chat_template: str | None,
    model_identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    info = retrieval_info or {}
    backend = str(info.get("backend", "unknown")) if settings.search else "none"
    spec = settings.rollout
    protocol: dict[str, Any] = {
        "label": settings.label or default_label(settings, backend),
        "model": settings.model,
        "tokenizer": settings.tokenizer or settings.model,
        "engine": settings.engine,
        "api": settings.api,
        "endpoint": {"server": settings.llm_url, "sglang": "sglang (managed)"}.get(
            settings.engine, f"local:{settings.device}"
        ),
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None,
        # which template rendered: the model's own (checked to keep tools=) or the repo's (--chat-template searchrl)
        "chat_template_source": settings.chat_template,
        # what the server (model path, weight version) or the local files say identifies the weights
        "model_identity": model_identity or {},
        "search": settings.search,
        "retrieval": {
            "urls": settings.retrieval_urls if settings.search else [],
            "backend": backend,
            "corpus": info.get("corpus"),
            "checksums": _checksums(info),
            "identity": retrieval_identity(info) if settings.search else {},
            "info": info,
        },
        "rollout": spec.model_dump(),
        "topk": spec.topk,
        "max_turns": spec.max_turns,
        "max_tokens_per_turn": spec.max_tokens_per_turn,
        "max_response_tokens": spec.max_response_tokens,
        "passage_max_chars": spec.passage_max_chars,
        "max_observation_chars": settings.observation_budget,
        "max_observation_tokens": settings.max_observation_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "seed": settings.seed,
        # every field each generation request carries (infer/llm.py PINNED_DECODING: no server default leaks in)
        "decoding": {
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "seed": settings.seed,
            **PINNED_DECODING,
            "deterministic_inference": settings.engine == "sglang" and settings.deterministic,
        },
        "stop_after_tool_call": settings.stop_after_tool_call,
        "malformed_feedback": settings.malformed_feedback,
        "prompt_format": spec.prompt_format,
        "prompt_version": prompt_version(spec.prompt_format),
        "max_failure_rate": settings.max_failure_rate,
        "qa": {
            "source": settings.qa,
            "path": str(qa_path),
            "sha256": _sha256_file(qa_path),
            "datasets": settings.dataset_filter,
            "limit": settings.limit,
            "sample_seed": settings.sample_seed,
            "n": n_questions,
        },
        "searchrl_version": __version__,
    }
    protocol["protocol_hash"] = protocol_hash(protocol)
    return protocol


# --- running -------------------------------------------------------------------------------------------------
async def _open_engine(settings: InferSettings) -> tuple[TextGenerator | ServerLLM, ChatRenderer | None]:
    if settings.engine == "local":
        from searchrl.infer.local import LocalLLM
        from searchrl.models import resolve_model

        # a known name (`searchrl model get`) loads from its folder, got on first use; the protocol keeps the name
        model = await asyncio.to_thread(resolve_model, settings.model)
        tok_path = await asyncio.to_thread(resolve_model, settings.tokenizer) if settings.tokenizer else model
        # the template check needs only the tokenizer: a template that drops the tool stops the run before the
        # weights load
        tokenizer = await asyncio.to_thread(load_tokenizer, tok_path)
        _prepare_template(tokenizer, settings)
        llm_local = await asyncio.to_thread(
            LocalLLM.from_pretrained,
            model,
            tokenizer=tokenizer,
            device=settings.device,
            threads=settings.local_threads,
        )
        return llm_local, ChatRenderer(llm_local.tokenizer)
    client_kwargs: dict[str, Any] = {
        "timeout_s": settings.llm_timeout_s,
        "max_retries": settings.llm_max_retries,
        "retry_max_wait_s": settings.llm_retry_max_wait_s,
        "max_connections": max(settings.concurrency, 8),
    }
    server: ServerLLM
    if settings.engine == "sglang":
        from searchrl.infer.sglang import start_sglang

        server = await start_sglang(
            settings.model,
            command=settings.sglang_command,
            extra_args=settings.sglang_args,
            startup_timeout_s=settings.sglang_startup_timeout_s,
            log_dir=settings.output_dir,
            deterministic=settings.deterministic,
            tool_call_parser=settings.api == "chat",
            **client_kwargs,
        )
    else:
        server = ServerLLM(
            settings.llm_url, settings.model, api_key=settings.llm_api_key_value(), **client_kwargs
        )
    try:
        await server.check_model(wait_s=settings.wait_for_llm_s)
        server.identity = await server.model_identity()
        renderer = None
        if settings.api == "completions":
            tokenizer = await asyncio.to_thread(load_tokenizer, settings.tokenizer or settings.model)
            _prepare_template(tokenizer, settings)
            renderer = ChatRenderer(tokenizer)
    except BaseException:
        await server.aclose()
        raise
    return server, renderer


def _prepare_template(tokenizer: Any, settings: InferSettings) -> str:
    """The chat template the run renders with: the repo's when asked, else the model's once it keeps tools=."""
    from searchrl.chat_template import prepare_chat_template

    return prepare_chat_template(
        tokenizer,
        model=settings.model,
        choice=settings.chat_template,
        tools=settings.search and settings.prompt_format == "searchrl",
    )


def result_paths(protocol: dict[str, Any], output_dir: Path) -> tuple[Path, Path]:
    """(`<label>-<hash>.json`, `<label>-<hash>.jsonl`): a changed protocol never overwrites an older run."""
    stem = f"{slugify(str(protocol['label']))}-{protocol['protocol_hash']}"
    return output_dir / f"{stem}.json", output_dir / f"{stem}.jsonl"


def _engine_identity(llm: TextGenerator | ServerLLM) -> dict[str, Any]:
    """What identifies the weights: the server's answer (`_open_engine`) or the local files' hash."""
    if isinstance(llm, ServerLLM):
        return dict(getattr(llm, "identity", None) or {})
    ident = getattr(llm, "weights_identity", None)
    return ident() if callable(ident) else {}


def drop_failed(path: Path, done: dict[str, dict[str, Any]]) -> list[str]:
    """`--retry-failed`: remove the failed records from `done` and their lines from `path` (atomically).

    The re-run questions append new lines; until they do, they are simply not done, so a retry killed
    half-way resumes like any run.
    """
    retry = [k for k, rec in done.items() if failed(rec)]
    if not retry:
        return []
    lines = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "protocol_hash" in row or question_key(row) not in retry:
                lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)
    for k in retry:
        del done[k]
    return retry


def read_progress(path: Path, protocol: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Records already written by an interrupted run of the same protocol, by question key (last line wins)."""
    if not path.exists():
        return {}
    done: dict[str, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                log.warning(
                    "%s:%d: a half-written line (killed mid-write); that question runs again", path, lineno
                )
                continue
            if "protocol_hash" in row:
                if row["protocol_hash"] != protocol["protocol_hash"]:
                    raise DataError(f"{path} belongs to another protocol; delete it or change --output-dir")
                continue
            done[question_key(row)] = row
    return done


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
    from searchrl.retrieval.client import RetrievalClient, summarize_client_stats

    if items is None:
        items, qa_path = load_qa(
            settings.qa, datasets=settings.dataset_filter, limit=settings.limit, seed=settings.sample_seed
        )
    assert qa_path is not None
    keys = [question_key({"data_source": it.data_source, "id": it.id}) for it in items]
    if len(set(keys)) != len(keys):
        raise DataError(f"{qa_path}: question ids repeat within a data source; give every row a unique 'id'")
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
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
    aborted: str | None = None
    fatal: BaseException | None = None
    generated = [0]  # tokens generated by the questions run in this session (a resume skips the others)
    try:
        llm, renderer = await _open_engine(settings)
        t_gen = time.perf_counter()
        try:
            protocol = build_protocol(
                settings,
                retrieval_info=info,
                qa_path=qa_path,
                n_questions=len(items),
                chat_template=getattr(renderer.tokenizer, "chat_template", None) if renderer else None,
                model_identity=await asyncio.to_thread(_engine_identity, llm),
            )
            json_path, jsonl_path = result_paths(protocol, settings.output_dir)
            done = read_progress(jsonl_path, protocol)
            if settings.retry_failed and done:
                retried = drop_failed(jsonl_path, done)
                log.info("--retry-failed: %d failed question(s) run again", len(retried))
            todo = [(k, it) for k, it in zip(keys, items, strict=True) if k not in done]
            if done:
                log.info("resuming %s: %d of %d questions already done", jsonl_path, len(done), len(items))
            planned = Counter(it.data_source for it in items)
            settings.output_dir.mkdir(parents=True, exist_ok=True)
            agent = SearchAgent(llm, retrieval, AgentConfig.from_settings(settings), renderer)
            torn = jsonl_path.exists() and not jsonl_path.read_bytes().endswith(b"\n")
            with jsonl_path.open("a", encoding="utf-8") as sink:
                if torn:  # a run killed mid-write left half a line: start ours on a fresh one
                    sink.write("\n")
                if not done and sink.tell() == 0:
                    sink.write(
                        json.dumps({"protocol_hash": protocol["protocol_hash"], "label": protocol["label"]})
                        + "\n"
                    )
                    sink.flush()

                def record(index: int, ep: Episode) -> None:
                    key, item = todo[index]
                    rec = score_episode(item, ep)
                    generated[0] += ep.completion_tokens
                    done[key] = rec
                    sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    sink.flush()
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
                    aborted, fatal = f"{exc.kind}: {exc}", exc
                except RunCannotBeValidError as exc:
                    aborted, fatal = f"stopped early: {exc}", exc
        finally:
            gen_s = time.perf_counter() - t_gen
            engine = getattr(llm, "stats", None)
            dropped = sorted(getattr(llm, "dropped_fields", ()))
            await llm.aclose()
    finally:
        client_stats = retrieval.stats() if retrieval is not None else None
        if retrieval is not None:
            await retrieval.aclose()
    questions = [done[k] for k in keys if k in done]
    summary, per_dataset = summarize(questions, max_failure_rate=settings.max_failure_rate, aborted=aborted)
    if info is not None:
        summary["retrieval_after"] = await _service_counters_after(settings)
    # throughput of this session: generated tokens over the time since the engine was up (searches included);
    # the local engine also says what it did inside generate() (batches, tokens/s of model time)
    summary["generated_tokens"] = generated[0]
    summary["tokens_per_s"] = round(generated[0] / gen_s, 2) if gen_s > 0 else 0.0
    if engine is not None and hasattr(engine, "as_dict"):
        summary["engine"] = engine.as_dict()
    if dropped:  # the server refused these pinned fields by name; its defaults applied to them
        protocol["decoding_dropped_by_server"] = dropped
    protocol["started_at"] = started.isoformat(timespec="seconds")
    protocol["wall_s"] = round(time.perf_counter() - t0, 3)
    result = {"protocol": protocol, "summary": summary, "per_dataset": per_dataset, "questions": questions}
    if (
        client_stats is not None
    ):  # per replica: sent, failed by kind, breaker (this session; not the protocol)
        result["retrieval_client"] = client_stats
        log.info("retrieval client: %s", summarize_client_stats(client_stats))
    json_path.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    result["path"] = str(json_path)
    log.info(
        "%s: %d questions, EM %.3f [%.3f, %.3f], %d search failures, %d LLM errors, %s in %.1fs (%.1f tok/s)",
        protocol["label"],
        len(questions),
        summary["em"],
        *summary["em_ci"],
        summary["search_failures"],
        summary["llm_errors"],
        "valid" if summary["valid"] else f"INVALID ({summary['invalid_reason']})",
        protocol["wall_s"],
        summary["tokens_per_s"],
    )
    if isinstance(fatal, RunCannotBeValidError):
        raise InvalidRunError(
            f"run stopped early, it can no longer be valid: {fatal}; {len(questions)} of {len(items)} questions "
            f"are in {json_path}; once the backend is healthy re-run the same command with --retry-failed"
        ) from fatal
    if fatal is not None:
        raise RetrievalUnavailableError(
            f"run stopped: {fatal}; {len(questions)} of {len(items)} questions are in {json_path} (marked "
            "invalid); fix the cause and re-run the same command to resume (add --retry-failed to re-run "
            "the failed ones)",
            kind=getattr(fatal, "kind", "fatal"),
        ) from fatal
    return result


def write_result(result: dict[str, Any], output_dir: Path) -> Path:
    """Write a result document under its protocol-hashed name (evaluate() already does this for its runs)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path, _ = (
        result_paths(result["protocol"], output_dir)
        if "protocol_hash" in result["protocol"]
        else (
            output_dir / f"{slugify(run_label(result))}.json",
            None,
        )
    )
    doc = {k: v for k, v in result.items() if k != "path"}
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def run_eval(settings: InferSettings, *, progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Evaluate (resuming a killed run of the same protocol) and write `<output_dir>/<label>-<hash>.json`."""
    result = asyncio.run(evaluate(settings, progress=progress))
    return Path(result.pop("path")), result


__all__ = [
    "PAPER_ORDER",
    "InvalidRunError",
    "QAItem",
    "RunCannotBeValidError",
    "answer_in_observation",
    "cannot_be_valid",
    "retrieval_identity",
    "build_protocol",
    "dataset_order",
    "evaluate",
    "failed",
    "failure_cell",
    "load_qa",
    "model_error_cell",
    "paper_table",
    "preflight_search",
    "protocol_hash",
    "question_key",
    "read_progress",
    "result_paths",
    "run_eval",
    "run_label",
    "score_episode",
    "summarize",
    "write_result",
]
