"""`searchrl compare`: many evaluation runs (models x backends x search on/off) side by side in one report.

    searchrl compare results/*.json --out reports/               # report over existing result files
    searchrl compare --models Qwen/Qwen2.5-3B-Instruct@http://h:30000/v1,ckpt/merged@http://h:30001/v1 \\
        --backends wiki=http://h:8000,google=http://h:8001 --tools on,off --qa dev --out reports/

The second form runs `searchrl eval` for every cell of the matrix first (search off runs once per model: it
does not depend on the backend). Output: `report.md` (the paper-style EM table with n, 95% intervals and the
failure columns, paired comparisons, the protocols), `report.html` (self-contained: inline CSS and the
matplotlib chart with error bars as a base64 PNG, the tables, and side-by-side transcripts of the questions the
runs disagree on) and `report.png`.

Numbers are only compared when they measure the same thing: `check_comparable` refuses runs over different
questions or under different rules (naming the fields) unless `--force`, and runs marked invalid (too many
failures, or aborted) unless `--allow-invalid`. A value is bolded only when it is the unique best and its
paired test against every other run is significant (p < 0.05): ties and noise are not winners.
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
from searchrl.infer.evaluate import (
    dataset_order,
    default_label,
    failure_cell,
    paper_table,
    question_key,
    run_eval,
    run_label,
)
from searchrl.infer.settings import InferSettings
from searchrl.stats import PairedComparison, paired_comparison

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
    """`LABEL=URL,LABEL=URL,...` (one retrieval service per backend)."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        label, sep, url = part.partition("=")
        if not sep or not label or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--backends entry {part!r} must be LABEL=http(s)://host:port")
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


# --- comparability ---------------------------------------------------------------------------------------------
# Protocol fields that must agree for two runs to be compared: the rules, decoding and the question set. The
# model, its endpoint, the backend and search on/off are what a comparison varies.
COMPARED_FIELDS = [
    "rollout",
    "max_observation_chars",
    "temperature",
    "top_p",
    "seed",
    "stop_after_tool_call",
    "malformed_feedback",
    "prompt_version",
    "qa.sha256",
    "qa.datasets",
    "qa.limit",
    "qa.sample_seed",
]


def _get(protocol: dict[str, Any], dotted: str) -> Any:
    value: Any = protocol
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def protocol_differences(runs: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """{field: [value per run]} for every compared field on which the runs disagree."""
    out = {}
    for name in COMPARED_FIELDS:
        values = [_get(r["protocol"], name) for r in runs]
        if any(v != values[0] for v in values[1:]):
            out[name] = values
    return out


def question_set_differences(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run whose questions differ from the first run's."""
    first = {question_key(q) for q in runs[0]["questions"]}
    lines = []
    for r in runs[1:]:
        keys = {question_key(q) for q in r["questions"]}
        if keys != first:
            lines.append(
                f"{run_label(r)!r} has {len(keys - first)} questions {run_label(runs[0])!r} lacks and lacks "
                f"{len(first - keys)} of its {len(first)}"
            )
    return lines


def check_comparable(
    runs: Sequence[dict[str, Any]], *, force: bool = False, allow_invalid: bool = False
) -> None:
    """Refuse (ConfigError, exit 2) to compare runs that do not measure the same thing, unless told to."""
    invalid = [r for r in runs if not r["summary"].get("valid", True)]
    if invalid and not allow_invalid:
        names = "; ".join(f"{run_label(r)!r}: {r['summary'].get('invalid_reason')}" for r in invalid)
        raise ConfigError(
            f"invalid run(s) {names}; fix and re-run them, or pass --allow-invalid to show them flagged"
        )
    if len(runs) < 2 or force:
        return
    problems = question_set_differences(runs)
    diffs = protocol_differences(runs)
    if diffs:
        problems.append(
            "protocols differ in "
            + ", ".join(
                f"{k} ({' vs '.join(json.dumps(v, default=str) for v in vals)})" for k, vals in diffs.items()
            )
        )
    if problems:
        raise ConfigError(
            "runs are not comparable: " + "; ".join(problems) + "; re-run them alike, or pass --force"
        )


def paired(
    runs: Sequence[dict[str, Any]], metric: str = "em"
) -> list[tuple[dict[str, Any], dict[str, Any], PairedComparison]]:
    """Each run against the first (the baseline), over the questions both answered."""
    base = {question_key(q): float(q[metric]) for q in runs[0]["questions"]}
    out = []
    for r in runs[1:]:
        mine = {question_key(q): float(q[metric]) for q in r["questions"]}
        shared = [k for k in base if k in mine]
        out.append((runs[0], r, paired_comparison([base[k] for k in shared], [mine[k] for k in shared])))
    return out


def paired_table(runs: Sequence[dict[str, Any]]) -> str:
    """Markdown: EM difference of each run vs the first, paired bootstrap 95% interval, McNemar p."""
    lines = [
        f"| run vs {run_label(runs[0])} | paired n | ΔEM | 95% CI | only this run right | only baseline right "
        "| McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r, c in paired(runs):
        lines.append(
            f"| {run_label(r).replace('|', '/')} | {c.n} | {c.diff:+.3f} | [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}] | "
            f"{c.b_only} | {c.a_only} | {c.p_value:.3g} |"
        )
    return "\n".join(lines)


def winners(runs: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Column -> label of the run that is the unique best AND significantly better than every other run.

    Per dataset the test is McNemar on that dataset's shared questions; for the avg column on all questions.
    """
    sources = dataset_order([ds for r in runs for ds in r["per_dataset"]])
    out: dict[str, str | None] = {}
    for col in [*sources, "avg"]:
        subset = [
            {**r, "questions": [q for q in r["questions"] if col == "avg" or q["data_source"] == col]}
            for r in runs
        ]
        vals = [_value(r, col) for r in runs]
        known = [v for v in vals if v is not None]
        out[col] = None
        if len(runs) < 2 or not known:
            continue
        best = max(known)
        if vals.count(best) != 1:
            continue  # a tie is not a win
        i = vals.index(best)
        order = [subset[i], *[s for j, s in enumerate(subset) if j != i]]
        if all(c.significant and c.diff < 0 for _, _, c in paired(order)):
            out[col] = run_label(runs[i])
    return out


# --- rendering -----------------------------------------------------------------------------------------------
def render_chart(runs: Sequence[dict[str, Any]], *, title: str | None = None) -> bytes:
    """PNG: EM per dataset (and avg) per run with 95% intervals, searches and failed questions per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = dataset_order([ds for r in runs for ds in r["per_dataset"]])
    cols = [*sources, "avg"]
    labels = [run_label(r) for r in runs]
    fig, (ax_em, ax_s) = plt.subplots(
        1,
        2,
        figsize=(max(8.0, 2.0 + 1.3 * len(cols) + 0.4 * len(runs)), 4.2),
        gridspec_kw={"width_ratios": [3, 1.3]},
    )
    width = 0.8 / len(runs)
    colors = plt.get_cmap("tab10").colors
    for i, r in enumerate(runs):
        stats = [r["per_dataset"].get(ds, {}) for ds in sources] + [r["summary"]]
        vals = [s.get("em", 0.0) for s in stats[:-1]] + [r["summary"]["em_avg"]]
        lows, highs = [], []
        for s, v in zip(stats, vals, strict=True):
            lo, hi = s.get("em_ci") or (v, v)
            lo, hi = (v, v) if lo != lo else (lo, hi)  # nan: no interval
            lows.append(max(0.0, v - lo))
            highs.append(max(0.0, hi - v))
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(cols))]
        label = labels[i] + ("" if r["summary"].get("valid", True) else " (INVALID)")
        ax_em.bar(xs, vals, width=width, label=label, color=colors[i % len(colors)])
        # 95% intervals per dataset; the macro average (last bar) has none
        ax_em.errorbar(
            xs[:-1],
            vals[:-1],
            yerr=[lows[:-1], highs[:-1]],
            fmt="none",
            ecolor="black",
            capsize=3,
            elinewidth=1,
        )
    n_by_col = [max((r["per_dataset"].get(ds, {}).get("n", 0) for r in runs), default=0) for ds in sources]
    ax_em.set_xticks(
        range(len(cols)), [f"{c}\nn={n}" for c, n in zip(sources, n_by_col, strict=True)] + ["avg"]
    )
    ax_em.set_ylim(0, 1.05)
    ax_em.set_ylabel("exact match (95% bootstrap CI)")
    ax_em.set_title("EM per dataset")
    ax_em.grid(axis="y", alpha=0.3)
    ax_em.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=2, frameon=False)
    ax_s.barh(
        range(len(runs)),
        [r["summary"]["searches"] for r in runs],
        color=[colors[i % 10] for i in range(len(runs))],
    )
    for i, r in enumerate(runs):
        s = r["summary"]
        ax_s.annotate(
            f"fail {s.get('questions_failed', 0)}/{s['n']}, LLM err {s.get('llm_errors', 0)}",
            (0, i),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=6,
        )
    ax_s.set_yticks(range(len(runs)), labels, fontsize=7)
    ax_s.invert_yaxis()
    ax_s.set_xlabel("searches per question")
    ax_s.set_title("Searches (and failed questions)")
    ax_s.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _protocol_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    p = run["protocol"]
    r = p.get("retrieval", {})
    checks = ", ".join(f"{k}={str(v)[:16]}" for k, v in (r.get("checksums") or {}).items()) or "-"
    return [
        ("model", str(p.get("model"))),
        ("endpoint", f"{p.get('endpoint')} ({p.get('engine')}, {p.get('api')})"),
        ("backend", f"{r.get('backend')} {', '.join(r.get('urls') or [])}".strip()),
        ("corpus", str(r.get("corpus") or "-")),
        ("checksums", checks),
        ("top-k / max turns", f"{p.get('topk')} / {p.get('max_turns')}"),
        ("rules", json.dumps(p.get("rollout"), sort_keys=True) if p.get("rollout") else "-"),
        ("temperature / seed", f"{p.get('temperature')} / {p.get('seed')}"),
        ("prompt", f"{p.get('prompt_format', 'searchrl')} {p.get('prompt_version')}"),
        (
            "questions",
            f"{p.get('qa', {}).get('n')} from {p.get('qa', {}).get('source')} "
            f"(sample seed {p.get('qa', {}).get('sample_seed')})",
        ),
        ("protocol hash", str(p.get("protocol_hash", "-"))),
        ("failures", failure_cell(run["summary"])),
        (
            "valid",
            "yes" if run["summary"].get("valid", True) else f"NO: {run['summary'].get('invalid_reason')}",
        ),
    ]


def render_markdown(runs: Sequence[dict[str, Any]], n_disagree: int, *, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "Pure exact match per dataset with 95% bootstrap intervals and n (avg = unweighted mean over datasets, as "
        "in Search-R1); reward = the shaped training score. A run is invalid when more than its max failure rate "
        "of questions had a search failure or LLM error.",
        "",
    ]
    lines += [paper_table(runs), ""]
    if len(runs) > 1:
        lines += ["## Paired comparisons (same questions)", "", paired_table(runs), ""]
    lines += [f"{n_disagree} questions where the runs disagree: see report.html for the transcripts.", ""]
    lines += ["## Protocols", ""]
    for run in runs:
        lines += [f"### {run_label(run)}", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in _protocol_rows(run)]
        lines.append("")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d2430;max-width:1400px}
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}th,td{border:1px solid #d6dae0;padding:4px 8px}
th{background:#f1f3f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.best{font-weight:700;background:#e8f5e9}
.grid{display:grid;gap:10px}.run{border:1px solid #d6dae0;border-radius:6px;padding:8px;min-width:0}
.ok{color:#1b7f3b}.bad{color:#b3261e}.q{margin-top:18px}
pre{white-space:pre-wrap;word-break:break-word;font-size:.78em;margin:4px 0;padding:6px;border-radius:4px}
pre.user{background:#eef2fb}pre.assistant{background:#f6f6f6}pre.tool{background:#fff8e5}
img{max-width:100%}.scroll{overflow-x:auto}
"""


def _cell(value: str, *, col: str, cls: str = "num") -> str:
    return f'<td class="{cls}" data-col="{html.escape(col)}">{html.escape(value)}</td>'


def render_html(
    runs: Sequence[dict[str, Any]],
    disagree: Sequence[tuple[str, list[dict[str, Any]]]],
    png: bytes,
    *,
    title: str,
    max_disagreements: int = 25,
) -> str:
    e = html.escape
    sources = dataset_order([ds for r in runs for ds in r["per_dataset"]])
    cols = [*sources, "avg", "f1", "searches", "format_valid", "n", "failed", "llm_errors", "length_cut"]
    win = winners(runs)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"]
    out.append(f"</head><body><h1>{e(title)}</h1>")
    out.append(
        f'<img alt="EM per dataset and searches per question" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    )
    out.append("<h2>Exact match</h2><table id='summary'><thead><tr><th>#</th><th>run</th>")
    out += [f"<th>{e(c)}</th>" for c in cols]
    out.append("</tr></thead><tbody>")
    for i, r in enumerate(runs, start=1):
        out.append(f"<tr data-run='{e(run_label(r), quote=True)}'><td>{i}</td><td>{e(run_label(r))}</td>")
        for c in cols:
            v = _value(r, c)
            if v is None:
                out.append(_cell("", col=c))
            elif c in ("n", "failed", "llm_errors", "length_cut"):
                out.append(_cell(str(int(v)), col=c))
            else:
                cls = "num best" if win.get(c) == run_label(r) else "num"
                text = f"{v:.3f}"
                ci = _interval(r, c)
                if ci:
                    text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
                out.append(_cell(text, col=c, cls=cls))
        if not r["summary"].get("valid", True):
            out.append(f"<td class='bad'>INVALID: {e(str(r['summary'].get('invalid_reason')))}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    out.append(
        "<p>Bold: the unique best value, significantly better than every other run (paired McNemar p &lt; 0.05). "
        "failed = questions with a search failure or LLM error.</p>"
    )
    if len(runs) > 1:
        out.append(
            "<h2>Paired comparisons</h2><table id='paired'><thead><tr><th>run vs baseline</th><th>n</th>"
        )
        out.append("<th>ΔEM</th><th>95% CI</th><th>McNemar p</th></tr></thead><tbody>")
        for _, rr, c in paired(runs):
            out.append(
                f"<tr><td>{e(run_label(rr))}</td><td class='num'>{c.n}</td><td class='num'>{c.diff:+.3f}</td>"
                f"<td class='num'>[{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]</td><td class='num'>{c.p_value:.3g}</td></tr>"
            )
        out.append("</tbody></table>")
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


def _interval(run: dict[str, Any], col: str) -> tuple[float, float] | None:
    src = run["summary"] if col == "f1" else run["per_dataset"].get(col)
    key = "f1_ci" if col == "f1" else "em_ci"
    ci = (src or {}).get(key)
    if not ci or ci[0] != ci[0]:
        return None
    return float(ci[0]), float(ci[1])


def _value(run: dict[str, Any], col: str) -> float | None:
    s = run["summary"]
    if col == "avg":
        return float(s["em_avg"])
    if col == "failed":
        return float(s.get("questions_failed", 0))
    if col == "llm_errors":
        return float(s.get("llm_errors", s.get("errors", 0)))
    if col == "length_cut":
        return float(s.get("length_truncated_turns", 0))
    if col in ("f1", "searches", "format_valid", "n"):
        return float(s[col])
    v = run["per_dataset"].get(col)
    return float(v["em"]) if v else None


def build_report(
    runs: Sequence[dict[str, Any]],
    out_dir: Path,
    *,
    title: str = "searchrl comparison",
    max_disagreements: int = 25,
) -> dict[str, Path]:
    """Write report.md, report.html and report.png into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    disagree = disagreements(runs)
    png = render_chart(runs, title=title)
    paths = {
        "markdown": out_dir / "report.md",
        "html": out_dir / "report.html",
        "png": out_dir / "report.png",
    }
    paths["png"].write_bytes(png)
    paths["markdown"].write_text(render_markdown(runs, len(disagree), title=title), encoding="utf-8")
    paths["html"].write_text(
        render_html(runs, disagree, png, title=title, max_disagreements=max_disagreements), encoding="utf-8"
    )
    log.info("report over %d runs (%d disagreements) in %s", len(runs), len(disagree), out_dir)
    return paths


__all__ = [
    "COMPARED_FIELDS",
    "ModelSpec",
    "build_report",
    "check_comparable",
    "disagreements",
    "load_runs",
    "parse_backends",
    "parse_models",
    "paired",
    "paired_table",
    "parse_tools",
    "protocol_differences",
    "question_set_differences",
    "render_chart",
    "render_html",
    "render_markdown",
    "run_matrix",
    "winners",
]
