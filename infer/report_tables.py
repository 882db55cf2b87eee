"""The report's tables as text: EM cells, the compare table, paired contrasts, retrieval and protocol rows.

Shared by report.md, report.html (infer/report.py) and `searchrl compare`'s stdout, so the three say the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from searchrl.infer.comparison import (
    AVG,
    Cell,
    Contrast,
    columns,
    max_failure_rate,
    prompt_format,
    retrieval_name,
    retrieval_stats,
    run_cells,
    winners,
)
from searchrl.infer.summary import failure_cell, run_label

LEGEND = (
    "EM = pure exact match, failed questions scored 0, with 95% Wilson intervals per dataset; Avg. = unweighted "
    "mean over datasets (as in Search-R1) with a stratified bootstrap interval. failed = questions with a search "
    "failure or LLM error (model mistakes such as malformed calls are not failures); excl. = EM over the "
    "questions that did not fail; INVALID marks a dataset whose failed share passes the run's max failure rate."
)


def md_escape(text: str) -> str:
    return text.replace("|", "/")


def _status(run: dict[str, Any]) -> str:
    return "" if run["summary"].get("valid", True) else " (INVALID)"


def cell_note(cell: Cell) -> str:
    """`failed 1/5 · excl. 0.750`, with INVALID when the dataset fails its gate."""
    text = f"failed {cell.failed}/{cell.n}"
    if cell.failed:
        text += f" · excl. {cell.em_answered:.3f}" if cell.em_answered is not None else " · excl. -"
    return text + ("" if cell.valid else " · INVALID")


def cell_text(cell: Cell) -> str:
    """`0.600 [0.31, 0.83] · failed 1/5 · excl. 0.750`, with INVALID when the dataset fails its gate."""
    return f"{cell.em:.3f} [{cell.ci[0]:.2f}, {cell.ci[1]:.2f}] · {cell_note(cell)}"


def model_behaviour(run: dict[str, Any]) -> str:
    """Mistakes the model made (malformed calls, empty queries, ...), counted apart from outages: `3 (kind n)`."""
    s = run["summary"]
    kinds = s.get("model_errors")
    if kinds is None:  # files written before model errors were counted apart: their malformed calls
        total = sum(int(q.get("malformed_calls", 0)) for q in run["questions"])
        kinds = {"malformed_call": total} if total else {}
    total = sum(int(n) for n in kinds.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")"


def compare_table(runs: Sequence[dict[str, Any]]) -> str:
    """Markdown: per run and dataset EM [CI] · failed/n · EM excl. failed, then Avg. and the run's counters."""
    cols = columns(runs)
    win = winners(runs)
    head = ["run", *[f"{c if c != AVG else 'Avg.'} EM" for c in cols]]
    head += ["F1", "searches/q", "format ok", "search failures", "model behaviour", "LLM errors", "valid"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in runs:
        s, cells = r["summary"], run_cells(r)
        row = [md_escape(run_label(r))]
        for c in cols:
            if c not in cells:
                row.append("")
                continue
            text = cell_text(cells[c])
            row.append(f"**{text}**" if win.get(c) == run_label(r) else text)
        row += [
            f"{s['f1']:.3f}",
            f"{s['searches']:.2f}",
            f"{s['format_valid']:.0%}",
            failure_cell(s),
            model_behaviour(r),
            str(s.get("llm_errors", s.get("errors", 0))),
            "yes" if s.get("valid", True) else f"**NO**: {s.get('invalid_reason')}",
        ]
        lines.append("| " + " | ".join(md_escape(c) for c in row) + " |")
    return "\n".join(lines)


def _p(value: float) -> str:
    return "-" if value != value else f"{value:.3g}"


def contrast_name(c: Contrast) -> str:
    return f"{run_label(c.other)}{_status(c.other)} − {run_label(c.ref)}{_status(c.ref)}"


def contrast_cell(c: Contrast, col: str) -> str:
    t = c.tests.get(col)
    if t is None:
        return ""
    excludes = t.ci[0] > 0 or t.ci[1] < 0
    mark = " †" if excludes != t.significant else ""  # only possible for Avg.: bootstrap vs randomization
    return (
        f"{t.diff:+.3f} [{t.ci[0]:+.2f}, {t.ci[1]:+.2f}] ({t.b_only}/{t.a_only}) "
        f"p {_p(t.p_value)}, Holm {_p(c.holm_p.get(col, float('nan')))}{mark}"
    )


def paired_note(found: Sequence[Contrast]) -> str:
    n_tests = sum(len(c.tests) for c in found)
    return (
        f"ΔEM = row's first run minus its second, over the questions both ran; (b/c) = questions only the first "
        f"/ only the second got right. p: McNemar's exact test per dataset (its interval excludes 0 exactly when "
        f"p < 0.05); Avg.: stratified paired bootstrap interval and a stratified sign-flip randomization test of "
        f"the macro difference (†: the two disagree on whether 0 is excluded; the test decides the bold). "
        f"Holm = p adjusted over all {n_tests} tests in this table."
    )


def paired_markdown(found: Sequence[Contrast], cols: Sequence[str]) -> str:
    head = ["contrast", "axis", *[c if c != AVG else "Avg." for c in cols]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * len(cols)) + "|"]
    for c in found:
        row = [contrast_name(c), c.axis, *[contrast_cell(c, col) for col in cols]]
        lines.append("| " + " | ".join(md_escape(x) for x in row) + " |")
    return "\n".join(lines)


def retrieval_rows(runs: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in runs:
        st = retrieval_stats(r)

        def num(v: Any, fmt: str = "{:.0f}") -> str:
            return "-" if v is None else fmt.format(v)

        rows.append(
            [
                run_label(r),
                retrieval_name(r),
                num(st["observation_chars"]),
                num(st["observation_tokens"]),
                num(st["page_fallbacks"], "{}"),
                num(st["blocked_results"], "{}"),
                num(r["summary"].get("answer_in_observation"), "{}"),
            ]
        )
    return rows


RETRIEVAL_HEAD = [
    "run",
    "retrieval",
    "mean observation chars",
    "mean observation tokens",
    "page-fetch fallbacks",
    "blocked results",
    "gold answer in an observation",
]


def _decoding(p: dict[str, Any]) -> str:
    """Every sampling field the requests carried, or the three older files recorded (server defaults unpinned)."""
    if p.get("decoding"):
        text = ", ".join(f"{k} {v}" for k, v in p["decoding"].items())
        dropped = p.get("decoding_dropped_by_server")
        return text + (f" (the server rejected {', '.join(dropped)}: dropped)" if dropped else "")
    return (
        f"temperature {p.get('temperature')}, top_p {p.get('top_p')}, seed {p.get('seed')}; other fields not "
        "pinned (the server's defaults applied)"
    )


def protocol_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    p = run["protocol"]
    r = p.get("retrieval", {})
    checks = ", ".join(f"{k}={str(v)[:16]}" for k, v in (r.get("checksums") or {}).items()) or "-"
    ident = r.get("identity")
    rollout = p.get("rollout") or {}
    return [
        ("model", str(p.get("model"))),
        ("weights", json.dumps(p.get("model_identity"), sort_keys=True) if p.get("model_identity") else "-"),
        ("endpoint", f"{p.get('endpoint')} ({p.get('engine')}, {p.get('api')})"),
        ("prompt", f"{prompt_format(run)} {p.get('prompt_version')}"),
        ("chat template sha256", str(p.get("chat_template_sha256") or "-")[:16]),
        ("retrieval", f"{retrieval_name(run)}: {r.get('backend')} {', '.join(r.get('urls') or [])}".strip()),
        ("corpus", str(r.get("corpus") or "-")),
        ("checksums", checks),
        ("retrieval identity", json.dumps(ident, sort_keys=True, default=str) if ident else "-"),
        ("rules", ", ".join(f"{k}={v}" for k, v in sorted(rollout.items())) or "-"),
        ("decoding", _decoding(p)),
        (
            "questions",
            f"{p.get('qa', {}).get('n')} from {p.get('qa', {}).get('source')} "
            f"(sample seed {p.get('qa', {}).get('sample_seed')})",
        ),
        ("protocol hash", str(p.get("protocol_hash", "-"))),
        ("failures", failure_cell(run["summary"])),
        ("max failure rate", f"{max_failure_rate(run):.1%} of each dataset and of the run"),
        (
            "valid",
            "yes" if run["summary"].get("valid", True) else f"NO: {run['summary'].get('invalid_reason')}",
        ),
    ]


__all__ = [
    "LEGEND",
    "RETRIEVAL_HEAD",
    "cell_note",
    "cell_text",
    "compare_table",
    "contrast_cell",
    "contrast_name",
    "md_escape",
    "model_behaviour",
    "paired_markdown",
    "paired_note",
    "protocol_rows",
    "retrieval_rows",
]
