"""`searchrl compare`: many evaluation runs (models x backends x search on/off) side by side in one report.

    searchrl compare results/*.json --out reports/               # report over existing result files
    searchrl compare --models Qwen/Qwen2.5-3B-Instruct@http://h:30000/v1,ckpt/merged@http://h:30001/v1 \\
        --backends wiki=http://h:8000,google=http://h:8001 --tools on,off --qa dev --out reports/

The second form runs `searchrl eval` for every cell of the matrix first (search off runs once per model: it
does not depend on the backend). Output: `report.md` (the paper-style EM table and the protocols),
`report.html` (self-contained: inline CSS and the matplotlib chart as a base64 PNG, the summary table, and
side-by-side transcripts of the questions the runs disagree on) and `report.png`.
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

from infer.evaluate import dataset_order, default_label, paper_table, run_eval, run_label
from infer.settings import InferSettings
from searchrl.errors import ConfigError, DataError

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


# --- rendering -----------------------------------------------------------------------------------------------
def render_chart(runs: Sequence[dict[str, Any]]) -> bytes:
    """PNG: EM per dataset (and avg) per run, and searches per question per run."""
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
        vals = [r["per_dataset"].get(ds, {}).get("em", 0.0) for ds in sources] + [r["summary"]["em_avg"]]
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(cols))]
        ax_em.bar(xs, vals, width=width, label=labels[i], color=colors[i % len(colors)])
    ax_em.set_xticks(range(len(cols)), cols)
    ax_em.set_ylim(0, 1.05)
    ax_em.set_ylabel("exact match")
    ax_em.set_title("EM per dataset")
    ax_em.grid(axis="y", alpha=0.3)
    ax_em.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=2, frameon=False)
    ax_s.barh(
        range(len(runs)),
        [r["summary"]["searches"] for r in runs],
        color=[colors[i % 10] for i in range(len(runs))],
    )
    ax_s.set_yticks(range(len(runs)), labels, fontsize=7)
    ax_s.invert_yaxis()
    ax_s.set_xlabel("searches per question")
    ax_s.set_title("Searches")
    ax_s.grid(axis="x", alpha=0.3)
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
        ("temperature / seed", f"{p.get('temperature')} / {p.get('seed')}"),
        ("prompt", str(p.get("prompt_version"))),
        ("questions", f"{p.get('qa', {}).get('n')} from {p.get('qa', {}).get('source')}"),
    ]


def render_markdown(runs: Sequence[dict[str, Any]], n_disagree: int, *, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "Exact match per dataset (avg = unweighted mean over datasets, as in Search-R1).",
        "",
    ]
    lines += [paper_table(runs), ""]
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
    cols = [*sources, "avg", "f1", "searches", "format_valid", "n"]
    best = {c: max((_value(r, c) for r in runs), default=0.0) for c in [*sources, "avg"]}
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
            elif c == "n":
                out.append(_cell(str(int(v)), col=c))
            else:
                cls = "num best" if c in best and len(runs) > 1 and v == best[c] and v > 0 else "num"
                out.append(_cell(f"{v:.3f}", col=c, cls=cls))
        out.append("</tr>")
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


def _value(run: dict[str, Any], col: str) -> float | None:
    s = run["summary"]
    if col == "avg":
        return float(s["em_avg"])
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
    png = render_chart(runs)
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
    "ModelSpec",
    "build_report",
    "disagreements",
    "load_runs",
    "parse_backends",
    "parse_models",
    "parse_tools",
    "render_chart",
    "render_html",
    "render_markdown",
    "run_matrix",
]
