"""The numbers behind `searchrl compare`: what may be compared, the cells of the EM table, and the contrasts.

Kept apart from the rendering (infer/report.py) so every number the report prints comes from one place and is
tested without matplotlib or HTML.

- Comparability. A run varies along four axes: the model, its prompt format (a released Search-R1 checkpoint
  next to ours), the retrieval behind it and search on/off. Everything else that decides the numbers must agree
  (`COMPARED_FIELDS`, compared leaf by leaf so a refusal names `rollout.topk`, not a dict); rules that come with a
  prompt format (`FORMAT_FIELDS`: turn budget, observation cap, prompt version, chat template...) are compared
  within a format only, and listed when formats differ. `--allow-protocol-diff` / `--allow-question-diff` let
  differences through, and everything let through is returned as the report's banner.
- Cells. Per run and dataset, from the per-question records (so files written before per-dataset failure counts
  existed still get them): EM with failures scored 0 and its Wilson interval, failed/n, EM over the questions
  that did not fail, and whether that dataset alone passes the run's failure gate. Avg. (the paper's unweighted
  mean over datasets) gets a stratified bootstrap interval.
- Contrasts. The pairs a paper reports: each model against the first one seen (same retrieval, same search
  setting), each retrieval against the first one seen (same model), search against no search (same model), or
  every run against `--baseline`. Each is tested per dataset (McNemar) and on Avg. (stratified randomization
  test of the macro difference), with Holm's adjustment over every test in the table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from searchrl.errors import ConfigError
from searchrl.infer.summary import dataset_order, failed, question_key, run_label
from searchrl.stats import (
    PairedComparison,
    holm,
    macro_ci,
    macro_paired,
    paired_comparison,
    wilson_ci,
)

AVG = "avg"
T = TypeVar("T")

# The report asks for the same cells, tests and winners several times (Markdown, HTML, stdout); over 51,713
# questions each pass costs seconds. Results are kept per (function, the runs' identities) for the last few
# calls, holding the runs themselves so an id is never reused while its entry lives.
_MEMO: dict[tuple[Any, ...], tuple[tuple[dict[str, Any], ...], Any]] = {}
_MEMO_SIZE = 64


def _memo(name: str, runs: Sequence[dict[str, Any]], extra: Any, compute: Callable[[], T]) -> T:
    key = (name, extra, *(id(r) for r in runs))
    hit = _MEMO.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], runs, strict=True)):
        return cast(T, hit[1])
    value = compute()
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = (tuple(runs), value)
    return value


# --- comparability -------------------------------------------------------------------------------------------
# Protocol fields (dotted; a dict is compared leaf by leaf) that must agree for runs to be compared. The model,
# its endpoint and tokenizer path, the retrieval, search on/off and the prompt format are what a comparison varies.
COMPARED_FIELDS = [
    "temperature",
    "top_p",
    "seed",
    "decoding",  # the pinned sampling fields (repetition_penalty, top_k, min_p), where the run records them
    "repetition_penalty",
    "top_k",
    "min_p",
    "decoding_dropped_by_server",  # a pinned field the server rejected: that run decoded under its default
    "api",
    "engine",
    "tokenizer_sha256",
    "max_failure_rate",
    "qa.sha256",
    "qa.datasets",
    "qa.limit",
    "qa.sample_seed",
]
# Rules a prompt format brings with it (Search-R1's preset: 500 tokens a turn, its own instruction): compared
# between runs of the same format; listed, not refused, between formats.
FORMAT_FIELDS = [
    "rollout",
    "max_observation_chars",
    "max_observation_tokens",
    "stop_after_tool_call",
    "malformed_feedback",
    "prompt_version",
    "chat_template_sha256",
    "chat_template_source",  # the model's own template or the repo's (--chat-template searchrl)
]
_AXIS_LEAVES = {"rollout.prompt_format"}  # an axis, not a rule


def _get(protocol: dict[str, Any], dotted: str) -> Any:
    value: Any = protocol
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    """{dotted path: value} of every non-dict leaf under `value` (the value itself when it is not a dict)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_leaves(v, f"{prefix}.{k}"))
    return out


def _differing_leaves(runs: Sequence[dict[str, Any]], fields: Sequence[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for name in fields:
        per_run = [_leaves(_get(r["protocol"], name), name) for r in runs]
        for leaf in sorted({k for leaves in per_run for k in leaves}):
            if leaf in _AXIS_LEAVES:
                continue
            values = [leaves.get(leaf) for leaves in per_run]
            if any(v != values[0] for v in values[1:]):
                out[leaf] = values
    return out


def prompt_format(run: dict[str, Any]) -> str:
    p = run["protocol"]
    return str(p.get("prompt_format") or (p.get("rollout") or {}).get("prompt_format") or "searchrl")


def protocol_differences(runs: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """{leaf field: [value per run]} for every compared field on which the runs disagree (refused by default)."""
    out = _differing_leaves(runs, COMPARED_FIELDS)
    for fmt in dict.fromkeys(prompt_format(r) for r in runs):
        idx = [i for i, r in enumerate(runs) if prompt_format(r) == fmt]
        for leaf, values in _differing_leaves([runs[i] for i in idx], FORMAT_FIELDS).items():
            full = out.setdefault(leaf, [None] * len(runs))
            for i, v in zip(idx, values, strict=True):
                full[i] = v
    return out


def format_differences(runs: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rules that differ between prompt formats (allowed: they come with the format); {} for one format."""
    if len({prompt_format(r) for r in runs}) < 2:
        return {}
    within = protocol_differences(runs)
    return {k: v for k, v in _differing_leaves(runs, FORMAT_FIELDS).items() if k not in within}


def describe_difference(runs: Sequence[dict[str, Any]], field: str, values: Sequence[Any]) -> str:
    """`rollout.topk: 3 ('a', 'b') vs 5 ('c')`: one field, each value once with the runs that have it."""
    groups: dict[str, list[str]] = {}
    for r, v in zip(runs, values, strict=True):
        groups.setdefault(json.dumps(v, sort_keys=True, default=str), []).append(repr(run_label(r)))
    return f"{field}: " + " vs ".join(f"{v} ({', '.join(names)})" for v, names in groups.items())


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
    runs: Sequence[dict[str, Any]],
    *,
    allow_protocol_diff: bool = False,
    allow_question_diff: bool = False,
    allow_invalid: bool = False,
) -> list[str]:
    """Refuse (ConfigError, exit 2) runs that do not measure the same thing, unless told to.

    Returns the banner: one line per difference let through (and per rule that comes with a prompt format), so
    the report says in its first lines what is not like for like.
    """
    banner = []
    invalid = [r for r in runs if not r["summary"].get("valid", True)]
    if invalid:
        names = "; ".join(f"{run_label(r)!r}: {r['summary'].get('invalid_reason')}" for r in invalid)
        if not allow_invalid:
            raise ConfigError(
                f"invalid run(s) {names}; fix and re-run them, or pass --allow-invalid to show them flagged"
            )
        banner.append(f"invalid runs included (--allow-invalid): {names}")
    if len(runs) < 2:
        return banner
    problems = []
    questions = question_set_differences(runs)
    if questions and not allow_question_diff:
        problems.append("; ".join(questions) + " (--allow-question-diff compares the shared questions)")
    banner += [f"question sets differ (--allow-question-diff): {q}" for q in questions]
    diffs = protocol_differences(runs)
    if diffs and not allow_protocol_diff:
        problems.append(
            "protocols differ in "
            + "; ".join(describe_difference(runs, k, v) for k, v in diffs.items())
            + " (--allow-protocol-diff reports them anyway)"
        )
    banner += [
        f"protocols differ (--allow-protocol-diff): {describe_difference(runs, k, v)}"
        for k, v in diffs.items()
    ]
    if problems:
        raise ConfigError("runs are not comparable: " + "; ".join(problems) + "; or re-run them alike")
    banner += [
        f"comes with the prompt format: {describe_difference(runs, k, v)}"
        for k, v in format_differences(runs).items()
    ]
    return banner


# --- cells ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One run on one dataset (or Avg.), from its per-question records."""

    n: int
    em: float  # failed questions scored 0, as the paper would
    ci: tuple[float, float]  # Wilson (a dataset) or stratified bootstrap (Avg.)
    failed: int  # questions with a search failure or LLM error (summary.failed)
    em_answered: float | None  # EM over the questions that did not fail; None when all failed
    valid: bool  # failed / n within the run's max failure rate


def max_failure_rate(run: dict[str, Any]) -> float:
    value = run["summary"].get("max_failure_rate", run["protocol"].get("max_failure_rate"))
    return 0.02 if value is None else float(value)  # 0.02: the default of files that did not record it


def _groups(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Records by dataset, datasets in the paper's order: a resumed file (other line order) gives the same Avg.
    interval as an uninterrupted one, since the bootstrap draws per dataset in this order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for q in run["questions"]:
        out.setdefault(str(q["data_source"]), []).append(q)
    return {ds: out[ds] for ds in dataset_order(list(out))}


def columns(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Dataset columns in the paper's order, then Avg. when there is more than one dataset."""
    sources = dataset_order(
        [ds for r in runs for ds in list(r["per_dataset"]) + [q["data_source"] for q in r["questions"]]]
    )
    return [*sources, AVG] if len(sources) > 1 else sources


def run_cells(run: dict[str, Any]) -> dict[str, Cell]:
    """{dataset: Cell, and "avg" over the datasets when there are several}."""
    return _memo("cells", [run], None, lambda: _run_cells(run))


def _run_cells(run: dict[str, Any]) -> dict[str, Cell]:
    limit = max_failure_rate(run)
    out: dict[str, Cell] = {}
    groups = _groups(run)
    for ds, rows in groups.items():
        em = [float(q["em"]) for q in rows]
        bad = [failed(q) for q in rows]
        answered = [e for e, b in zip(em, bad, strict=True) if not b]
        listed = run["summary"].get("invalid_datasets")  # the run's own per-dataset gate, where recorded
        out[ds] = Cell(
            n=len(rows),
            em=sum(em) / len(rows),
            ci=wilson_ci(round(sum(em)), len(rows)),
            failed=sum(bad),
            em_answered=sum(answered) / len(answered) if answered else None,
            valid=ds not in listed if isinstance(listed, list) else sum(bad) / len(rows) <= limit,
        )
    if len(groups) > 1:
        ems = [[float(q["em"]) for q in rows] for rows in groups.values()]
        answered_means = [c.em_answered for c in out.values()]
        n_failed = sum(c.failed for c in out.values())
        n = sum(c.n for c in out.values())
        out[AVG] = Cell(
            n=n,
            em=sum(c.em for c in out.values()) / len(groups),
            ci=macro_ci(ems),
            failed=n_failed,
            em_answered=(
                sum(a for a in answered_means if a is not None) / len(answered_means)
                if all(a is not None for a in answered_means)
                else None
            ),
            valid=all(c.valid for c in out.values()) and n_failed / n <= limit,
        )
    return out


# --- contrasts -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contrast:
    """`other` minus `ref` over the questions both ran, per column, with Holm-adjusted p-values."""

    ref: dict[str, Any]
    other: dict[str, Any]
    axis: str  # model | retrieval | search | baseline | first run
    tests: dict[str, PairedComparison]
    holm_p: dict[str, float]


def retrieval_key(run: dict[str, Any]) -> str:
    """What the run searched, for grouping: the recorded retrieval identity without URLs, or 'none'."""
    p = run["protocol"]
    if not p.get("search", True):
        return "none"
    ident = (p.get("retrieval") or {}).get("identity")
    if not ident:  # files written before the identity was recorded
        r = dict(p.get("retrieval") or {})
        r.pop("urls", None)
        r.pop("info", None)
        ident = r
    return json.dumps(ident, sort_keys=True, default=str)


def system_key(run: dict[str, Any]) -> str:
    """The model and the prompt format it is asked in."""
    return f"{run['protocol'].get('model')}|{prompt_format(run)}"


def find_run(runs: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    """The run labelled `name` (or whose label alone contains it); ConfigError naming the labels otherwise."""
    exact = [r for r in runs if run_label(r) == name]
    hits = exact or [r for r in runs if name.lower() in run_label(r).lower()]
    if len(hits) != 1:
        labels = ", ".join(repr(run_label(r)) for r in runs)
        what = "matches no run" if not hits else f"matches {len(hits)} runs"
        raise ConfigError(f"--baseline {name!r} {what}; give one of the labels {labels}")
    return hits[0]


def contrast_pairs(
    runs: Sequence[dict[str, Any]], baseline: str | None = None
) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(reference, other, axis) pairs: every run against `baseline`, else the pairs that differ in one axis.

    Model: runs with the same retrieval and search setting, against the first model seen. Retrieval: the same
    model, both searching, against the first retrieval seen. Search: the same model with search against without.
    Runs that share no axis with another are compared with the first run given.
    """
    if baseline is not None:
        ref = find_run(runs, baseline)
        return [(ref, r, "baseline") for r in runs if r is not ref]
    pairs: list[tuple[dict[str, Any], dict[str, Any], str]] = []
    systems = list(dict.fromkeys(system_key(r) for r in runs))
    retrievals = list(dict.fromkeys(retrieval_key(r) for r in runs if retrieval_key(r) != "none"))
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            same_sys, same_ret = system_key(a) == system_key(b), retrieval_key(a) == retrieval_key(b)
            if same_ret and not same_sys:
                ref, other = sorted((a, b), key=lambda r: systems.index(system_key(r)))
                pairs.append((ref, other, "model"))
            elif same_sys and not same_ret:
                ka, kb = retrieval_key(a), retrieval_key(b)
                if "none" in (ka, kb):
                    ref, other = (a, b) if ka == "none" else (b, a)
                    pairs.append((ref, other, "search"))
                else:
                    ref, other = sorted((a, b), key=lambda r: retrievals.index(retrieval_key(r)))
                    pairs.append((ref, other, "retrieval"))
    covered = {id(r) for p in pairs for r in p[:2]}
    pairs += [(runs[0], r, "first run") for r in runs[1:] if id(r) not in covered]
    order = {"model": 0, "retrieval": 1, "search": 2, "first run": 3}
    return sorted(pairs, key=lambda p: order[p[2]])


def _scores(run: dict[str, Any], metric: str) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """{dataset: (question keys, scores)} of one run, in its order."""

    def build() -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        keys: dict[str, list[str]] = {}
        vals: dict[str, list[float]] = {}
        for q in run["questions"]:
            ds = str(q["data_source"])
            keys.setdefault(ds, []).append(question_key(q))
            vals.setdefault(ds, []).append(float(q[metric]))
        return {ds: (tuple(keys[ds]), np.asarray(vals[ds])) for ds in keys}

    return _memo("scores", [run], metric, build)


def _paired_scores(
    ref: dict[str, Any], other: dict[str, Any], metric: str = "em"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{dataset: (ref scores, other scores)} over the questions both runs have, in the ref's order."""
    mine = _scores(other, metric)
    out = {}
    for ds, (keys, a) in _scores(ref, metric).items():
        if ds not in mine:
            continue
        okeys, b = mine[ds]
        if okeys == keys:  # the usual case: the same questions in the same order
            out[ds] = (a, b)
            continue
        where = {k: i for i, k in enumerate(okeys)}
        idx = [(i, where[k]) for i, k in enumerate(keys) if k in where]
        if idx:
            ia, ib = (np.asarray(x) for x in zip(*idx, strict=True))
            out[ds] = (a[ia], b[ib])
    return out


def compare_pair(
    ref: dict[str, Any], other: dict[str, Any], cols: Sequence[str]
) -> dict[str, PairedComparison]:
    """{column: other - ref}: McNemar per dataset, the stratified macro test for Avg."""
    scores = _paired_scores(ref, other)
    out = {}
    for col in cols:
        if col == AVG:
            ds = [d for d in cols if d != AVG and d in scores]
            out[col] = macro_paired([scores[d][0] for d in ds], [scores[d][1] for d in ds])
        elif col in scores:
            out[col] = paired_comparison(*scores[col])
    return out


def contrasts(runs: Sequence[dict[str, Any]], baseline: str | None = None) -> list[Contrast]:
    """The report's paired table, Holm-adjusted over every test in it."""
    return _memo("contrasts", runs, baseline, lambda: _contrasts(runs, baseline))


def _contrasts(runs: Sequence[dict[str, Any]], baseline: str | None) -> list[Contrast]:
    cols = columns(runs)
    raw = [
        (ref, other, axis, compare_pair(ref, other, cols))
        for ref, other, axis in contrast_pairs(runs, baseline)
    ]
    flat = [(i, col, t.p_value) for i, (*_, tests) in enumerate(raw) for col, t in tests.items()]
    adjusted = holm([p for *_, p in flat])
    holm_p: list[dict[str, float]] = [{} for _ in raw]
    for (i, col, _), adj in zip(flat, adjusted, strict=True):
        holm_p[i][col] = adj
    return [Contrast(ref, other, axis, tests, holm_p[i]) for i, (ref, other, axis, tests) in enumerate(raw)]


def winners(runs: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Column -> label of the run that is the unique best AND significantly better than every other run.

    The tests are McNemar per dataset and the stratified macro test for Avg., Holm-adjusted together over every
    (column, other run) test of the column leaders.
    """
    return _memo("winners", runs, None, lambda: _winners(runs))


def _winners(runs: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    cols = columns(runs)
    cells = [run_cells(r) for r in runs]
    leaders: dict[str, int] = {}
    for col in cols:
        vals = [c[col].em if col in c else None for c in cells]
        known = [v for v in vals if v is not None]
        if len(runs) < 2 or not known or vals.count(max(known)) != 1:
            continue  # a tie is not a win
        leaders[col] = vals.index(max(known))
    tests = []
    for col, i in leaders.items():
        for j, r in enumerate(runs):
            if j != i:
                t = compare_pair(r, runs[i], cols if col == AVG else [col])
                tests.append((col, t.get(col)))
    adjusted = holm([t.p_value if t is not None else 1.0 for _, t in tests])
    out: dict[str, str | None] = dict.fromkeys(cols)
    for col, i in leaders.items():
        mine = [(t, p) for (c, t), p in zip(tests, adjusted, strict=True) if c == col]
        if all(t is not None and t.diff > 0 and p < 0.05 for t, p in mine):
            out[col] = run_label(runs[i])
    return out


# --- what the retrieval did ------------------------------------------------------------------------------------
_INFO_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)


CORPUS_NAMES = {"bundled": "wiki-subset-10k", "wiki18": "wiki18", "wiki18-100k": "wiki18-100k"}


def service_label(info: dict[str, Any]) -> str:
    """A column label for what a retrieval service serves, from its GET /: `wiki18`, `wiki-subset-10k` (the
    bundled 10k summaries), `google-snippets`, `google-pages` (page mode), else the corpus file's name; a
    hybrid is `hybrid-<corpus>`."""
    backend = str(info.get("backend") or "unknown")
    if backend.startswith("google") or info.get("provider"):
        return "google-pages" if info.get("page_mode") else "google-snippets"
    corpus = info.get("corpus")
    parts = info.get("parts")
    if not corpus and isinstance(parts, list) and parts:
        corpus = parts[0].get("corpus") if isinstance(parts[0], dict) else None
    name = CORPUS_NAMES.get(str(corpus), str(corpus or "").rstrip("/").rsplit("/", 1)[-1].split(".")[0])
    name = name or backend
    return f"hybrid-{name}" if backend == "hybrid" else name


def retrieval_name(run: dict[str, Any]) -> str:
    """What a run searched, in words: `wiki18 (dense)`, `wiki-subset-10k (bm25)`, `google-snippets`, `none`."""
    p = run["protocol"]
    if not p.get("search", True):
        return "none"
    r = p.get("retrieval") or {}
    info = {"backend": r.get("backend"), "corpus": r.get("corpus"), **(r.get("info") or {})}
    label = service_label(info)
    backend = str(info.get("backend") or "unknown")
    return label if label.startswith(("google", "hybrid")) or label == backend else f"{label} ({backend})"


def observation_chars(record: dict[str, Any]) -> list[int]:
    """Lengths of the observations the model was shown: tool messages, or Search-R1's <information> blocks."""
    out = []
    for msg in record.get("transcript") or []:
        if msg.get("role") == "tool":
            out.append(len(str(msg.get("content", ""))))
        elif msg.get("role") == "assistant":
            out += [len(m) for m in _INFO_RE.findall(str(msg.get("content", "")))]
    return out


def retrieval_stats(run: dict[str, Any]) -> dict[str, Any]:
    """Per run: mean observation length (chars from transcripts, tokens when recorded), and the web service's
    page-fetch fallbacks and blocked results during the run (GET / after minus before), when recorded."""
    lengths = [n for q in run["questions"] for n in observation_chars(q)]
    s = run["summary"]
    before = (run["protocol"].get("retrieval") or {}).get("info") or {}
    after = s.get("retrieval_after") or run.get("retrieval_after") or {}
    out: dict[str, Any] = {
        "observations": len(lengths),
        "observation_chars": s.get(
            "observation_chars_mean", sum(lengths) / len(lengths) if lengths else None
        ),
        "observation_tokens": s.get("observation_tokens_mean"),
    }
    for key, name in (("page_fetch_failures", "page_fallbacks"), ("blocked_results", "blocked_results")):
        if name in s:
            out[name] = s[name]
        elif key in after and key in before and after.get("url") in (None, before.get("url")):
            delta = int(after[key]) - int(before[key])
            out[name] = delta if delta >= 0 else None  # another replica answered (a load balancer): unknown
        else:
            out[name] = None
    return out


__all__ = [
    "AVG",
    "COMPARED_FIELDS",
    "FORMAT_FIELDS",
    "Cell",
    "Contrast",
    "check_comparable",
    "columns",
    "compare_pair",
    "contrast_pairs",
    "contrasts",
    "describe_difference",
    "find_run",
    "format_differences",
    "observation_chars",
    "protocol_differences",
    "question_set_differences",
    "retrieval_name",
    "retrieval_stats",
    "run_cells",
    "service_label",
    "winners",
]
