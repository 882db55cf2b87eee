"""`searchrl compare`'s report: many evaluation runs (models x backends x search on/off) side by side.

    searchrl compare results/*.json --out reports/               # report over existing result files

Output: `report.md` (the paper-style EM table with n, 95% intervals and the failure columns, paired comparisons,
the protocols), `report.html` (self-contained: inline CSS and the matplotlib chart with error bars as a base64
PNG, the tables, and side-by-side transcripts of the questions the runs disagree on) and `report.png`. This
module renders only: the runs come from infer/runs.py (result files, or the matrix run first), the chart from
infer/chart.py, and every number from infer/comparison.py.

Numbers are only compared when they measure the same thing (infer/comparison.py): runs over different questions
or under different rules are refused, naming each differing sub-field, unless `--allow-question-diff` /
`--allow-protocol-diff`, and runs marked invalid unless `--allow-invalid`; whatever is let through heads the
report as a banner. Cells show EM with its interval and failed/n; Avg. has a stratified interval; the paired
table holds the contrasts a paper reports (or every run against `--baseline`), Holm-adjusted. A value is bolded
only when it is the unique best and its paired test against every other run is significant: ties and noise are
not winners.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.infer.chart import render_chart
from searchrl.infer.comparison import (
    AVG,
    columns,
    contrasts,
    find_run,
    run_cells,
    winners,
)
from searchrl.infer.report_tables import (
    LEGEND,
    RETRIEVAL_HEAD,
    cell_note,
    compare_table,
    contrast_cell,
    contrast_name,
    md_escape,
    model_behaviour,
    paired_markdown,
    paired_note,
    protocol_rows,
    retrieval_rows,
)
from searchrl.infer.summary import run_label

log = logging.getLogger(__name__)


# --- where the runs disagree --------------------------------------------------------------------------------
def disagreements(runs: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Questions (asked in every run) whose EM differs between runs: [(key, [record per run])]."""
    keyed = [{(q["data_source"], q["id"]): q for q in r["questions"]} for r in runs]
    out = []
    for key in keyed[0]:
        recs = [k.get(key) for k in keyed]
        if any(rec is None for rec in recs):
            continue
        if len({rec["em"] for rec in recs if rec is not None}) > 1:
            out.append((f"{key[0]}/{key[1]}", [rec for rec in recs if rec is not None]))
    return out


def render_markdown(
    runs: Sequence[dict[str, Any]],
    n_disagree: int,
    *,
    title: str,
    banner: Sequence[str] = (),
    baseline: str | None = None,
) -> str:
    lines = [f"# {title}", ""]
    if banner:
        lines += ["> **Not like for like.** These differences were let through:", ">"]
        lines += [f"> - {md_escape(b)}" for b in banner]
        lines.append("")
    lines += [LEGEND, "", compare_table(runs), ""]
    lines += [
        "Bold: the unique best value, significantly better than every other run (paired tests, Holm-adjusted).",
        "",
        "## Retrieval",
        "",
        "| " + " | ".join(RETRIEVAL_HEAD) + " |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(md_escape(x) for x in row) + " |" for row in retrieval_rows(runs)]
    lines.append("")
    if len(runs) > 1:
        found = contrasts(runs, baseline)
        lines += ["## Paired comparisons (same questions)", "", paired_markdown(found, columns(runs)), ""]
        lines += [paired_note(found), ""]
    lines += [f"{n_disagree} questions where the runs disagree: see report.html for the transcripts.", ""]
    lines += ["## Protocols", ""]
    for run in runs:
        lines += [f"### {run_label(run)}", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {md_escape(v)} |" for k, v in protocol_rows(run)]
        lines.append("")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d2430;max-width:1400px}
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}th,td{border:1px solid #d6dae0;padding:4px 8px}
th{background:#f1f3f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.best{font-weight:700;background:#e8f5e9}td.bad{color:#b3261e;font-weight:600}
.banner{border:2px solid #b3261e;background:#fdecea;padding:8px 12px;border-radius:6px}
.sub{display:block;font-size:.85em;color:#555}
.grid{display:grid;gap:10px}.run{border:1px solid #d6dae0;border-radius:6px;padding:8px;min-width:0}
.ok{color:#1b7f3b}.bad{color:#b3261e}.q{margin-top:18px}
pre{white-space:pre-wrap;word-break:break-word;font-size:.78em;margin:4px 0;padding:6px;border-radius:4px}
pre.user{background:#eef2fb}pre.assistant{background:#f6f6f6}pre.tool{background:#fff8e5}
img{max-width:100%}.scroll{overflow-x:auto}
"""


def _td(value: str, *, col: str, cls: str = "num", sub: str = "") -> str:
    extra = f"<span class='sub'>{html.escape(sub)}</span>" if sub else ""
    return f'<td class="{cls}" data-col="{html.escape(col)}">{html.escape(value)}{extra}</td>'


def _summary_html(runs: Sequence[dict[str, Any]]) -> list[str]:
    e = html.escape
    cols = columns(runs)
    win = winners(runs)
    extra = ["f1", "searches", "format_valid", "n", "failed", "model_behaviour", "llm_errors", "length_cut"]
    out = ["<h2>Exact match</h2><div class='scroll'><table id='summary'><thead><tr><th>#</th><th>run</th>"]
    out += [f"<th>{e(c if c != AVG else 'Avg.')}</th>" for c in cols]
    out += [f"<th>{e(c)}</th>" for c in extra] + ["<th>valid</th></tr></thead><tbody>"]
    for i, r in enumerate(runs, start=1):
        s, cells = r["summary"], run_cells(r)
        out.append(f"<tr data-run='{e(run_label(r), quote=True)}'><td>{i}</td><td>{e(run_label(r))}</td>")
        for c in cols:
            cell = cells.get(c)
            if cell is None:
                out.append(_td("", col=c))
                continue
            cls = "num best" if win.get(c) == run_label(r) else "num"
            em = f"{cell.em:.3f} [{cell.ci[0]:.2f}, {cell.ci[1]:.2f}]"
            out.append(_td(em, col=c, cls=cls, sub=cell_note(cell)))
        out += [
            _td(f"{s['f1']:.3f}", col="f1"),
            _td(f"{s['searches']:.3f}", col="searches"),
            _td(f"{s['format_valid']:.3f}", col="format_valid"),
            _td(str(s["n"]), col="n"),
            _td(str(s.get("questions_failed", 0)), col="failed"),
            _td(model_behaviour(r), col="model_behaviour"),
            _td(str(s.get("llm_errors", s.get("errors", 0))), col="llm_errors"),
            _td(str(s.get("length_truncated_turns", 0)), col="length_cut"),
        ]
        if s.get("valid", True):
            out.append(_td("yes", col="valid", cls="ok"))
        else:
            out.append(_td(f"INVALID: {s.get('invalid_reason')}", col="valid", cls="bad"))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return out


def render_html(
    runs: Sequence[dict[str, Any]],
    disagree: Sequence[tuple[str, list[dict[str, Any]]]],
    png: bytes,
    *,
    title: str,
    max_disagreements: int = 25,
    banner: Sequence[str] = (),
    baseline: str | None = None,
) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"]
    out.append(f"</head><body><h1>{e(title)}</h1>")
    if banner:
        out.append(
            "<div class='banner' id='banner'><b>Not like for like.</b> These differences were let through:<ul>"
        )
        out += [f"<li>{e(b)}</li>" for b in banner]
        out.append("</ul></div>")
    out.append(
        f'<img alt="EM per dataset and searches per question" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    )
    out += _summary_html(runs)
    out.append(
        f"<p>{e(LEGEND)} Bold: the unique best value, significantly better than every other run "
        "(paired tests, Holm-adjusted).</p>"
    )
    out.append("<h2>Retrieval</h2><table id='retrieval'><thead><tr>")
    out += [f"<th>{e(h)}</th>" for h in RETRIEVAL_HEAD] + ["</tr></thead><tbody>"]
    for row in retrieval_rows(runs):
        out.append("<tr>" + "".join(f"<td>{e(x)}</td>" for x in row) + "</tr>")
    out.append("</tbody></table>")
    if len(runs) > 1:
        cols = columns(runs)
        found = contrasts(runs, baseline)
        out.append("<h2>Paired comparisons</h2><div class='scroll'><table id='paired'><thead><tr>")
        out += ["<th>contrast</th><th>axis</th>", *[f"<th>{e(c if c != AVG else 'Avg.')}</th>" for c in cols]]
        out.append("</tr></thead><tbody>")
        for c in found:
            bad = (
                ""
                if c.ref["summary"].get("valid", True) and c.other["summary"].get("valid", True)
                else " class='bad'"
            )
            out.append(f"<tr><td{bad}>{e(contrast_name(c))}</td><td>{e(c.axis)}</td>")
            out += [f"<td class='num'>{e(contrast_cell(c, col))}</td>" for col in cols]
            out.append("</tr>")
        out.append(f"</tbody></table></div><p>{e(paired_note(found))}</p>")
    shown = list(disagree)[:max_disagreements]
    out.append(f"<h2>Where the runs disagree ({len(disagree)} questions, {len(shown)} shown)</h2>")
    for key, recs in shown:
        q = recs[0]
        out.append(f"<div class='q' id='q-{e(key, quote=True)}'><b>{e(key)}</b>: {e(q['question'])}<br>")
        out.append(f"golden: {e(' / '.join(q['golden_answers']))}</div>")
        out.append(
            f"<div class='scroll'><div class='grid' style='grid-template-columns:repeat({len(recs)},minmax(200px,1fr))'>"
        )
        for r, rec in zip(runs, recs, strict=True):
            mark = "ok" if rec["em"] else "bad"
            out.append(f"<div class='run'><b>{e(run_label(r))}</b><br>")
            out.append(
                f"<span class='{mark}'>answer: {e(str(rec['answer']))} (EM {rec['em']:.2f})</span>, "
                f"{rec['searches']} searches, {rec['turns']} turns, stop: {e(rec['stop_reason'])}"
            )
            for msg in rec.get("transcript", []):
                role = str(msg.get("role", ""))
                body = str(msg.get("content", ""))
                if role == "user":
                    continue  # the same prompt in every run
                out.append(f"<pre class='{e(role, quote=True)}'>[{e(role)}] {e(body)}</pre>")
            out.append("</div>")
        out.append("</div></div>")
    out.append("<h2>Protocols</h2><div class='scroll'><table id='protocols'><thead><tr><th>field</th>")
    out += [f"<th>{e(run_label(r))}</th>" for r in runs]
    out.append("</tr></thead><tbody>")
    rows = [protocol_rows(r) for r in runs]
    for j, (field_name, _) in enumerate(rows[0]):
        out.append(
            f"<tr><td>{e(field_name)}</td>" + "".join(f"<td>{e(rr[j][1])}</td>" for rr in rows) + "</tr>"
        )
    out.append("</tbody></table></div>")
    out.append("</body></html>")
    return "".join(out)


def build_report(
    runs: Sequence[dict[str, Any]],
    out_dir: Path,
    *,
    title: str = "searchrl comparison",
    max_disagreements: int = 25,
    banner: Sequence[str] = (),
    baseline: str | None = None,
) -> dict[str, Path]:
    """Write report.md, report.html and report.png into `out_dir`; returns their paths."""
    if baseline is not None:
        find_run(runs, baseline)  # a wrong name fails before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    disagree = disagreements(runs)
    png = render_chart(runs, title=title, banner=banner)
    paths = {
        "markdown": out_dir / "report.md",
        "html": out_dir / "report.html",
        "png": out_dir / "report.png",
    }
    paths["png"].write_bytes(png)
    paths["markdown"].write_text(
        render_markdown(runs, len(disagree), title=title, banner=banner, baseline=baseline), encoding="utf-8"
    )
    paths["html"].write_text(
        render_html(
            runs,
            disagree,
            png,
            title=title,
            max_disagreements=max_disagreements,
            banner=banner,
            baseline=baseline,
        ),
        encoding="utf-8",
    )
    log.info("report over %d runs (%d disagreements) in %s", len(runs), len(disagree), out_dir)
    return paths


__all__ = ["build_report", "disagreements", "render_html", "render_markdown"]
