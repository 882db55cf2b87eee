"""`searchrl compare`: many evaluation runs (models x backends x search on/off) side by side in one report.

    searchrl compare results/*.json --out reports/               # report over existing result files
    searchrl compare --models Qwen/Qwen2.5-3B-Instruct@http://h:30000/v1,ckpt/merged@http://h:30001/v1 \\
        --backends wiki=http://h:8000,google=http://h:8001 --tools on,off --qa dev --out reports/

The second form runs `searchrl eval` for every cell of the matrix first (search off runs once per model: it
does not depend on the backend). Output: `report.md` (the paper-style EM table with n, 95% intervals and the
failure columns, paired comparisons, the protocols), `report.html` (self-contained: inline CSS and the
matplotlib chart with error bars as a base64 PNG, the tables, and side-by-side transcripts of the questions the
runs disagree on) and `report.png`.

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
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, DataError
from searchrl.infer.comparison import (
    AVG,
    COMPARED_FIELDS,
    Cell,
    Contrast,
    check_comparable,
    columns,
    contrasts,
    find_run,
    max_failure_rate,
    prompt_format,
    protocol_differences,
    question_set_differences,
    retrieval_name,
    retrieval_stats,
    run_cells,
    service_label,
    winners,
)
from searchrl.infer.evaluate import run_eval
from searchrl.infer.protocol import default_label
from searchrl.infer.settings import InferSettings
from searchrl.infer.summary import failure_cell, run_label

log = logging.getLogger(__name__)


# --- the matrix ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    name: str  # served model name / HF id
    url: str | None = None  # OpenAI-compatible base URL; None = the settings' llm_url


def parse_models(spec: str) -> list[ModelSpec]:
    """`NAME[@URL],NAME[@URL],...`"""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, url = part.partition("@")
        if not name or (sep and not url.startswith(("http://", "https://"))):
            raise ConfigError(f"--models entry {part!r} must be NAME or NAME@http(s)://host:port/v1")
        out.append(ModelSpec(name=name, url=url or None))
    if not out:
        raise ConfigError("--models is empty; give NAME[@URL] entries separated by commas")
    short = [m.name.rstrip("/").split("/")[-1] for m in out]
    dupes = sorted({s for s in short if short.count(s) > 1})
    if dupes:
        raise ConfigError(
            f"--models entries share the name {dupes}, so their results would overwrite each other; "
            "serve them under distinct names (sglang/vLLM --served-model-name)"
        )
    return out


def parse_backends(spec: str) -> list[tuple[str, str]]:
    """`[LABEL=]URL,...` (one retrieval service per backend). An entry without a label ("") is named after what
    the service says it serves (`service_label`), so a column cannot be labelled for another corpus."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        label, sep, url = part.partition("=") if "=" in part else ("", "", part)
        if (sep and not label) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--backends entry {part!r} must be [LABEL=]http(s)://host:port")
        out.append((label, url))
    if not out:
        raise ConfigError("--backends is empty; give LABEL=URL entries separated by commas")
    return out


def parse_tools(spec: str) -> list[bool]:
    values = {"on": True, "off": False}
    out = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if part not in values:
            raise ConfigError(f"--tools entry {part!r} must be on or off")
        out.append(values[part])
    return out


def run_matrix(
    base: InferSettings,
    models: Sequence[ModelSpec],
    backends: Sequence[tuple[str, str]],
    tools: Sequence[bool] = (True, False),
    *,
    progress: bool = True,
) -> list[Path]:
    """Evaluate every (model, backend, search on/off) cell and return the result files, in matrix order."""
    paths = []
    backends = [
        (label or service_label(_service_info(url, base.retrieval_api_key_value())), url)
        for label, url in backends
    ]
    for m in models:
        for search in tools:
            cells = backends if search else [("none", base.retrieval_url)]
            for backend_label, url in cells:
                overrides: dict[str, Any] = {
                    "model": m.name,
                    "search": search,
                    "retrieval_url": url,
                    "label": None,
                }
                if m.url:
                    overrides["llm_url"] = m.url
                s = base.model_copy(update=overrides)
                s = s.model_copy(update={"label": default_label(s, backend_label)})
                log.info("running %s", s.label)
                path, _ = run_eval(s, progress=progress)
                paths.append(path)
    return paths


def _service_info(url: str, api_key: str | None) -> dict[str, Any]:
    import asyncio

    from searchrl.infer.evaluate import fetch_retrieval_info

    return asyncio.run(fetch_retrieval_info([url], api_key))


# --- loading -------------------------------------------------------------------------------------------------
def load_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Result documents from files or directories of `*.json` (directories sorted by name)."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(p.glob("*.json")))
        elif p.exists():
            files.append(p)
        else:
            raise DataError(f"result file {p} not found; run `searchrl eval` first")
    runs = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{f}: not a JSON result file ({exc.msg})") from exc
        if not isinstance(doc, dict) or not {"protocol", "summary", "per_dataset", "questions"} <= doc.keys():
            raise DataError(
                f"{f}: not a `searchrl eval` result (needs protocol, summary, per_dataset, questions)"
            )
        runs.append(doc)
    if not runs:
        raise DataError(f"no result files in {', '.join(map(str, paths))}")
    labels = [run_label(r) for r in runs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise DataError(f"two result files share the label {dupes}; re-run one with --label")
    return runs


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


# --- tables --------------------------------------------------------------------------------------------------
LEGEND = (
    "EM = pure exact match, failed questions scored 0, with 95% Wilson intervals per dataset; Avg. = unweighted "
    "mean over datasets (as in Search-R1) with a stratified bootstrap interval. failed = questions with a search "
    "failure or LLM error (model mistakes such as malformed calls are not failures); excl. = EM over the "
    "questions that did not fail; INVALID marks a dataset whose failed share passes the run's max failure rate."
)


def _esc(text: str) -> str:
    return text.replace("|", "/")


def _status(run: dict[str, Any]) -> str:
    return "" if run["summary"].get("valid", True) else " (INVALID)"


def cell_text(cell: Cell) -> str:
    """`0.600 [0.31, 0.83] · failed 1/5 · excl. 0.750`, with INVALID when the dataset fails its gate."""
    text = f"{cell.em:.3f} [{cell.ci[0]:.2f}, {cell.ci[1]:.2f}] · failed {cell.failed}/{cell.n}"
    if cell.failed:
        text += f" · excl. {cell.em_answered:.3f}" if cell.em_answered is not None else " · excl. -"
    return text + ("" if cell.valid else " · INVALID")


def _model_behaviour(run: dict[str, Any]) -> str:
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
        row = [_esc(run_label(r))]
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
            _model_behaviour(r),
            str(s.get("llm_errors", s.get("errors", 0))),
            "yes" if s.get("valid", True) else f"**NO**: {s.get('invalid_reason')}",
        ]
        lines.append("| " + " | ".join(_esc(c) for c in row) + " |")
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
        lines.append("| " + " | ".join(_esc(x) for x in row) + " |")
    return "\n".join(lines)


def _retrieval_rows(runs: Sequence[dict[str, Any]]) -> list[list[str]]:
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


# --- rendering -----------------------------------------------------------------------------------------------
MIN_FONT = 9  # points: legend, tick labels and annotations stay readable when the PNG is shrunk into a page


def chart_figure(
    runs: Sequence[dict[str, Any]], *, title: str | None = None, banner: Sequence[str] = ()
) -> Any:
    """matplotlib Figure: EM per dataset (and Avg.) per run with 95% intervals; searches and failures per run.

    Invalid runs are hatched (and say so in the legend); an EM of 0 is drawn as a visible stub, not left out;
    the banner's differences are printed under the chart, so the picture alone does not pass for like for like.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(runs)
    labels = [run_label(r) for r in runs]
    cells = [run_cells(r) for r in runs]
    fig, (ax_em, ax_s) = plt.subplots(
        1,
        2,
        figsize=(max(9.0, 2.5 + 1.4 * len(cols) + 0.4 * len(runs)), 4.8),
        gridspec_kw={"width_ratios": [3, 1.4]},
    )
    width = 0.8 / len(runs)
    colors = plt.get_cmap("tab10").colors
    stub = 0.008  # height of the stub that shows an EM of exactly 0
    for i, r in enumerate(runs):
        invalid = not r["summary"].get("valid", True)
        xs, vals, lows, highs = [], [], [], []
        for j, col in enumerate(cols):
            cell = cells[i].get(col)
            if cell is None:
                continue
            xs.append(j + (i - (len(runs) - 1) / 2) * width)
            vals.append(cell.em)
            lo, hi = cell.ci if cell.ci[0] == cell.ci[0] else (cell.em, cell.em)
            lows.append(max(0.0, cell.em - lo))
            highs.append(max(0.0, hi - cell.em))
        color = colors[i % len(colors)]
        ax_em.bar(
            xs,
            [max(v, stub) for v in vals],
            width=width,
            label=labels[i] + (" (INVALID)" if invalid else ""),
            color=color,
            hatch="//" if invalid else None,
            edgecolor="black" if invalid else color,
            linewidth=0.6,
        )
        ax_em.errorbar(xs, vals, yerr=[lows, highs], fmt="none", ecolor="black", capsize=3, elinewidth=1)
    n_by_col = [max((c[col].n for c in cells if col in c), default=0) for col in cols]
    ax_em.set_xticks(
        range(len(cols)),
        [f"{c}\nn={n}" if c != AVG else "Avg." for c, n in zip(cols, n_by_col, strict=True)],
        fontsize=MIN_FONT,
    )
    ax_em.tick_params(axis="y", labelsize=MIN_FONT)
    ax_em.set_ylim(0, 1.05)
    ax_em.set_ylabel("exact match (95% CI)", fontsize=MIN_FONT + 1)
    ax_em.set_title("EM per dataset (hatched: invalid run)", fontsize=MIN_FONT + 1)
    ax_em.grid(axis="y", alpha=0.3)
    ax_em.legend(fontsize=MIN_FONT, loc="upper left", bbox_to_anchor=(0, -0.14), ncol=2, frameon=False)
    for i, r in enumerate(runs):
        invalid = not r["summary"].get("valid", True)
        ax_s.barh(
            i,
            r["summary"]["searches"],
            color=colors[i % 10],
            hatch="//" if invalid else None,
            edgecolor="black" if invalid else colors[i % 10],
        )
        s = r["summary"]
        ax_s.annotate(
            f"failed {s.get('questions_failed', 0)}/{s['n']}, LLM err {s.get('llm_errors', 0)}",
            (0, i),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=MIN_FONT,
        )
    ax_s.set_yticks(range(len(runs)), labels, fontsize=MIN_FONT)
    ax_s.tick_params(axis="x", labelsize=MIN_FONT)
    ax_s.invert_yaxis()
    ax_s.set_xlabel("searches per question", fontsize=MIN_FONT + 1)
    ax_s.set_title("Searches (and failed questions)", fontsize=MIN_FONT + 1)
    ax_s.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=MIN_FONT + 2)
    fig.tight_layout()
    if banner:
        shown = [b if len(b) <= 150 else b[:147] + "..." for b in banner[:4]]
        more = [f"... and {len(banner) - 4} more (report.md)"] if len(banner) > 4 else []
        fig.text(
            0.01,
            0.0,
            "\n".join(["Not like for like:", *shown, *more]),
            ha="left",
            va="top",
            fontsize=MIN_FONT,
            color="#b3261e",
            transform=fig.transFigure,
        )
    return fig


def render_chart(
    runs: Sequence[dict[str, Any]], *, title: str | None = None, banner: Sequence[str] = ()
) -> bytes:
    """PNG of `chart_figure`."""
    import matplotlib.pyplot as plt

    fig = chart_figure(runs, title=title, banner=banner)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


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


def _protocol_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
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
        lines += [f"> - {_esc(b)}" for b in banner]
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
    lines += ["| " + " | ".join(_esc(x) for x in row) + " |" for row in _retrieval_rows(runs)]
    lines.append("")
    if len(runs) > 1:
        found = contrasts(runs, baseline)
        lines += ["## Paired comparisons (same questions)", "", paired_markdown(found, columns(runs)), ""]
        lines += [paired_note(found), ""]
    lines += [f"{n_disagree} questions where the runs disagree: see report.html for the transcripts.", ""]
    lines += ["## Protocols", ""]
    for run in runs:
        lines += [f"### {run_label(run)}", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {_esc(v)} |" for k, v in _protocol_rows(run)]
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
            sub = f"failed {cell.failed}/{cell.n}"
            if cell.failed:
                sub += f" · excl. {cell.em_answered:.3f}" if cell.em_answered is not None else " · excl. -"
            if not cell.valid:
                sub += " · INVALID"
            cls = "num best" if win.get(c) == run_label(r) else "num"
            out.append(_td(f"{cell.em:.3f} [{cell.ci[0]:.2f}, {cell.ci[1]:.2f}]", col=c, cls=cls, sub=sub))
        out += [
            _td(f"{s['f1']:.3f}", col="f1"),
            _td(f"{s['searches']:.3f}", col="searches"),
            _td(f"{s['format_valid']:.3f}", col="format_valid"),
            _td(str(s["n"]), col="n"),
            _td(str(s.get("questions_failed", 0)), col="failed"),
            _td(_model_behaviour(r), col="model_behaviour"),
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
    for row in _retrieval_rows(runs):
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
    rows = [_protocol_rows(r) for r in runs]
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


__all__ = [
    "COMPARED_FIELDS",
    "ModelSpec",
    "build_report",
    "chart_figure",
    "check_comparable",
    "compare_table",
    "disagreements",
    "load_runs",
    "parse_backends",
    "parse_models",
    "parse_tools",
    "protocol_differences",
    "question_set_differences",
    "render_chart",
    "render_html",
    "render_markdown",
    "run_matrix",
    "winners",
]
