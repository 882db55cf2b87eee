"""What a run's records add up to: one question's record, the summary and per-dataset figures, the paper table.

A record holds the answer, pure EM (the paper's), the shaped reward, F1, searches, failures by kind, turns, stop
reason, latency and transcript; EM and F1 come from `searchrl.scoring`, the scorer the training reward uses, and
intervals from `searchrl.stats`. A question fails when the service failed one of its searches or the LLM rejected
a request; what the model causes (malformed calls, calls without a usable query, empty Search-R1 queries) is
counted as its behaviour, never as a failure. A run whose failed share passes `max_failure_rate`, over all
questions or within any one dataset, is invalid (`summarize`); `cannot_be_valid` says when that is already
certain mid-run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from searchrl.infer.agent import STOP_LLM_ERROR, Episode
from searchrl.infer.qa import QAItem
from searchrl.prompt import POLICY_FAILURES
from searchrl.scoring import score_response
from searchrl.stats import bootstrap_ci, proportion_ci

# Column order of the paper's table (arXiv 2503.09516, Table 2); other data sources follow alphabetically.
PAPER_ORDER = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


# --- records ------------------------------------------------------------------------------------------------
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


# --- aggregation --------------------------------------------------------------------------------------------
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


# --- tables -------------------------------------------------------------------------------------------------
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


__all__ = [
    "PAPER_ORDER",
    "answer_in_observation",
    "cannot_be_valid",
    "dataset_order",
    "failed",
    "failure_cell",
    "model_error_cell",
    "model_error_counts",
    "paper_table",
    "question_key",
    "run_label",
    "score_episode",
    "service_failures",
    "summarize",
]
