"""`searchrl compare` without servers: comparability, the cells, Avg., the contrasts and the chart, over result
documents summarised by the real `summarize` (tests/infer/compare_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import main
from searchrl.errors import ConfigError
from searchrl.infer.chart import chart_figure
from searchrl.infer.comparison import (
    AVG,
    check_comparable,
    contrast_pairs,
    contrasts,
    retrieval_name,
    retrieval_stats,
    run_cells,
)
from searchrl.infer.report import build_report
from searchrl.infer.report_tables import compare_table, contrast_cell, paired_markdown
from searchrl.stats import holm, macro_ci, macro_paired, mcnemar_p, wilson_ci
from tests.conftest import TINY_CORPUS
from tests.infer.compare_fixtures import ems, run

NQ_BASE, HQ_BASE = "1100110000" * 3, "10" * 20


def _pair() -> tuple[dict[str, Any], dict[str, Any]]:
    base = run("base, wiki18", ems("nq", NQ_BASE) + ems("hotpotqa", HQ_BASE))
    trained = run(
        "trained, wiki18",
        ems("nq", "1111110000" * 3) + ems("hotpotqa", "11" * 10 + "10" * 10),
        model="ckpt/t",
    )
    return base, trained


def _write(tmp_path: Path, *runs: dict[str, Any]) -> Path:
    d = tmp_path / "results"
    d.mkdir(exist_ok=True)
    for i, r in enumerate(runs):
        (d / f"{i}.json").write_text(json.dumps(r))
    return d


# --- Avg. and the paired tests -----------------------------------------------------------------------------------
def test_avg_has_a_stratified_interval_and_one_dataset_has_no_avg() -> None:
    base, _ = _pair()
    cells = run_cells(base)
    groups = [[float(c) for c in NQ_BASE], [float(c) for c in HQ_BASE]]
    assert cells[AVG].em == pytest.approx((0.4 + 0.5) / 2) and cells[AVG].ci == macro_ci(groups)
    assert cells["nq"].ci == wilson_ci(12, 30)
    assert f"{cells[AVG].em:.3f} [{cells[AVG].ci[0]:.2f}, {cells[AVG].ci[1]:.2f}]" in compare_table([base])
    one = run("nq only", ems("nq", NQ_BASE))
    assert AVG not in run_cells(one) and "Avg." not in compare_table([one])


def test_avg_is_tested_on_the_macro_difference_not_pooled_mcnemar() -> None:
    """A small dataset with a big gain and a big one with a small loss: the pooled questions say 'no difference'
    (McNemar on 6 wins vs 10 losses), the macro average (what Avg. prints) moved +0.28."""
    base = run("base", ems("bamboogle", "0" * 6 + "1" * 4) + ems("nq", "1" * 10 + "0" * 190))
    new = run("new", ems("bamboogle", "1" * 10) + ems("nq", "0" * 200), model="m2")
    (c,) = contrasts([base, new])
    avg = c.tests[AVG]
    # datasets in the paper's order (nq before bamboogle), as the report takes them
    expect = macro_paired([[1.0] * 10 + [0.0] * 190, [0.0] * 6 + [1.0] * 4], [[0.0] * 200, [1.0] * 10])
    assert avg == expect and avg.diff == pytest.approx((0.6 - 0.05) / 2)
    assert avg.p_value != pytest.approx(mcnemar_p(6, 10))
    assert c.tests["nq"].p_value == pytest.approx(mcnemar_p(0, 10))
    flat = [c.tests[k].p_value for k in ("bamboogle", "nq", AVG)]  # Holm over every test in the table
    assert [c.holm_p[k] for k in ("bamboogle", "nq", AVG)] == pytest.approx(holm(flat))


def test_contrasts_a_paper_needs_not_all_against_the_first() -> None:
    """2 models x (wiki18, google, no search): trained - base within each retrieval, google - wiki18 within each
    model, search - no search within each model; none of them is 'every run minus the alphabetically first'."""
    runs = []
    for model in ("base", "trained"):
        for name, ret in (
            ("wiki18", {}),
            ("google", {"retrieval__backend": "google"}),
            ("none", {"search": False}),
        ):
            runs.append(run(f"{model}, {name}", ems("nq", NQ_BASE), model=model, **ret))
    pairs = {(o["protocol"]["label"], r["protocol"]["label"], axis) for r, o, axis in contrast_pairs(runs)}
    assert ("trained, wiki18", "base, wiki18", "model") in pairs
    assert ("trained, google", "base, google", "model") in pairs and (
        "trained, none",
        "base, none",
        "model",
    ) in pairs
    assert ("base, google", "base, wiki18", "retrieval") in pairs and (
        "trained, google",
        "trained, wiki18",
        "retrieval",
    ) in pairs
    assert ("trained, wiki18", "trained, none", "search") in pairs and (
        "base, google",
        "base, none",
        "search",
    ) in pairs
    assert len(pairs) == 3 + 2 + 4
    assert ("trained, google", "base, wiki18", "model") not in pairs  # two axes at once: not a contrast
    based = contrast_pairs(runs, baseline="trained, none")
    assert len(based) == 5 and all(r["protocol"]["label"] == "trained, none" for r, _, _ in based)
    with pytest.raises(
        ConfigError, match=r"--baseline 'google' matches 2 runs; give one of the labels 'base, wiki18'"
    ):
        contrast_pairs(runs, baseline="google")


def test_baseline_flag_and_force_is_gone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, trained = _pair()
    d = _write(tmp_path, base, trained)
    assert main(["compare", str(d), "--force", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--force is gone: pass --allow-protocol-diff" in err and "--allow-question-diff" in err
    assert main(["compare", str(d), "--baseline", "nope", "--out", str(tmp_path / "r")]) == 2
    assert "--baseline 'nope' matches no run" in capsys.readouterr().err
    assert main(["compare", str(d), "--baseline", "trained", "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| base, wiki18 − trained, wiki18 | baseline |" in md


# --- comparability -------------------------------------------------------------------------------------------
def test_differences_are_named_by_sub_field() -> None:
    base, trained = _pair()
    wider = run("wider", base["questions"], rollout__topk=5)
    with pytest.raises(ConfigError, match=r"rollout\.topk: 3 \('base, wiki18'\) vs 5 \('wider'\)") as exc:
        check_comparable([base, wider])
    assert "--allow-protocol-diff" in str(exc.value) and "{" not in str(exc.value)
    for field, value in [("api", "chat"), ("engine", "sglang"), ("chat_template_sha256", "d" * 64),
                         ("max_failure_rate", 0.1), ("decoding_dropped_by_server", ["top_k"])]:  # fmt: skip
        other = run("other", base["questions"], **{field: value})
        with pytest.raises(ConfigError, match=field):
            check_comparable([base, other])
    pinned = run("pinned", base["questions"], decoding={"repetition_penalty": 1.0, "top_k": -1})
    with pytest.raises(ConfigError, match=r"decoding\.repetition_penalty: null \('base, wiki18'\) vs 1\.0"):
        check_comparable([base, pinned])  # an older, unpinned run is not comparable with a pinned one
    assert check_comparable([base, trained]) == []  # the model is an axis


def test_prompt_format_is_an_axis() -> None:
    """A released Search-R1 checkpoint in its own format next to ours: compared, its preset listed, not refused."""
    base, _ = _pair()
    released = run(
        "Search-R1 3B",
        base["questions"],
        model="PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-3b-em-ppo",
        prompt_format="search-r1",
        prompt_version="search-r1@a14dc3a",
        rollout__prompt_format="search-r1",
        rollout__max_tokens_per_turn=500,
    )
    banner = check_comparable([base, released])
    assert (
        "comes with the prompt format: rollout.max_tokens_per_turn: null ('base, wiki18') vs 500" in banner[0]
    )
    assert any("prompt_version" in b for b in banner)
    # within one format the same rule still has to agree
    mine = run("ours, 500 a turn", base["questions"], rollout__max_tokens_per_turn=500)
    with pytest.raises(ConfigError, match="rollout.max_tokens_per_turn"):
        check_comparable([base, released, mine])


def test_allowed_differences_head_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = _pair()
    wider = run("wider", base["questions"][:-1], rollout__topk=5)
    d = _write(tmp_path, base, wider)
    assert main(["compare", str(d), "--allow-protocol-diff", "--out", str(tmp_path / "a")]) == 2
    assert "--allow-question-diff compares the shared questions" in capsys.readouterr().err
    argv = ["compare", str(d), "--allow-protocol-diff", "--allow-question-diff", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    top = md.split("\n## ")[0]
    assert "**Not like for like.**" in top
    assert "protocols differ (--allow-protocol-diff): rollout.topk: 3 ('base, wiki18') vs 5 ('wider')" in top
    assert "question sets differ (--allow-question-diff): 'wider' has 0 questions" in top
    html_text = (tmp_path / "r" / "report.html").read_text()
    banner = html_text[html_text.index("id='banner'") : html_text.index("<img")]
    assert "rollout.topk: 3 (&#x27;base, wiki18&#x27;) vs 5" in banner and "question sets differ" in banner
    assert "warning: protocols differ" in capsys.readouterr().err


# --- cells: failed/n, EM without failures, per-dataset validity -------------------------------------------------
def test_every_cell_has_failed_over_n_and_em_without_failures() -> None:
    """4 failed of 40 hotpotqa questions (10%) but 4 of 240 overall (1.7%, under 2%): the dataset is invalid."""
    r = run("outage", ems("nq", "10" * 100) + ems("hotpotqa", "1" * 30 + "0" * 10, fails={0, 1, 2, 35}))
    cells = run_cells(r)
    hq = cells["hotpotqa"]
    assert (hq.n, hq.failed, hq.valid) == (40, 4, False) and hq.em == pytest.approx(30 / 40)
    assert hq.em_answered == pytest.approx(27 / 36)  # 3 of the failed were right, 1 wrong
    assert cells["nq"].valid and cells["nq"].failed == 0
    table = compare_table([r])
    assert "0.500 [0.43, 0.57] · failed 0/200 |" in table
    assert "0.750 [0.60, 0.86] · failed 4/40 · excl. 0.750 · INVALID |" in table


def test_old_result_files_still_report(tmp_path: Path) -> None:
    """Files from before per-dataset gates and model-error counts: computed from the per-question records."""
    base, trained = _pair()
    for r in (base, trained):
        for key in ("invalid_datasets", "model_errors", "questions_with_model_errors"):
            r["summary"].pop(key, None)
        r["questions"][0]["malformed_calls"] = 2
    paths = build_report([base, trained], tmp_path)
    md = paths["markdown"].read_text()
    assert "| 2 (malformed_call 2) |" in md and "other fields not pinned" in md


# --- retrieval -------------------------------------------------------------------------------------------------
def test_retrieval_is_named_and_its_behaviour_shown() -> None:
    wiki = run("w", ems("nq", "10", obs="x" * 300) + ems("nq", "1", obs="y" * 100)[:0])
    subset = run("s", ems("nq", "10"), retrieval__corpus="bundled", retrieval__backend="bm25")
    info = {
        "backend": "google",
        "provider": "serper",
        "page_mode": True,
        "blocked_results": 4,
        "page_fetch_failures": 1,
    }
    pages = run(
        "p", ems("nq", "10"), retrieval__backend="google", retrieval__corpus=None, retrieval__info=info
    )
    pages["summary"]["retrieval_after"] = {**info, "blocked_results": 10, "page_fetch_failures": 4}
    snippets = run("g", ems("nq", "10"), retrieval__backend="google", retrieval__info={"page_mode": False})
    off = run("n", ems("nq", "10"), search=False)
    assert [retrieval_name(r) for r in (wiki, subset, pages, snippets, off)] == [
        "wiki18 (dense)", "wiki-subset-10k (bm25)", "google-pages", "google-snippets", "none",
    ]  # fmt: skip
    assert retrieval_stats(wiki)["observation_chars"] == 300
    st = retrieval_stats(pages)
    assert (st["blocked_results"], st["page_fallbacks"]) == (6, 3)
    assert retrieval_stats(snippets)["blocked_results"] is None
    # the read after the run reached another replica (another URL, or counters that went down): unknown, not wrong
    pages["summary"]["retrieval_after"] = {**info, "blocked_results": 2, "page_fetch_failures": 5}
    assert retrieval_stats(pages)["blocked_results"] is None and retrieval_stats(pages)["page_fallbacks"] == 4
    pages["protocol"]["retrieval"]["info"]["url"] = "http://10.0.0.1:8000"
    pages["summary"]["retrieval_after"] = {**info, "url": "http://10.0.0.2:8000", "blocked_results": 9}
    assert retrieval_stats(pages)["blocked_results"] is None
    r1 = run(
        "r1",
        [
            ems("nq", "1")[0]
            | {
                "transcript": [
                    {
                        "role": "assistant",
                        "content": "<search> q </search>\n\n<information>Doc 1 abc</information>\n\n",
                    }
                ]
            }
        ],
    )
    assert retrieval_stats(r1)["observation_chars"] == len("Doc 1 abc")


# --- the chart -----------------------------------------------------------------------------------------------
def _bars(ax: Any) -> list[Any]:
    from matplotlib.patches import Rectangle

    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_chart_hatches_invalid_runs_shows_zero_and_reads_at_9pt() -> None:
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation

    ok = run("ok", ems("nq", "0" * 10) + ems("hotpotqa", "1" * 10))
    bad = run("bad", ems("nq", "0" * 10, fails={0, 1}) + ems("hotpotqa", "1" * 10), model="m2")
    assert not bad["summary"]["valid"]
    fig = chart_figure([ok, bad])
    ax_em, ax_s = fig.axes
    bars = _bars(ax_em)
    assert len(bars) == 2 * 3  # nq, hotpotqa, Avg. per run
    assert [b.get_hatch() for b in bars] == [None] * 3 + ["//"] * 3
    assert all(b.get_height() > 0 for b in bars)  # EM 0 on nq still draws a stub
    assert [t.get_text().split("\n")[0] for t in ax_em.get_xticklabels()] == ["nq", "hotpotqa", "Avg."]
    legend = [t.get_text() for t in ax_em.get_legend().get_texts()]
    assert legend == ["ok", "bad (INVALID)"]
    texts = [*ax_em.get_legend().get_texts(), *ax_em.get_xticklabels(), *ax_s.get_yticklabels()]
    texts += [c for c in ax_s.get_children() if isinstance(c, Annotation)]
    assert texts and min(t.get_fontsize() for t in texts) >= 9
    assert [b.get_hatch() for b in _bars(ax_s)] == [None, "//"]
    plt.close(fig)
    banner = check_comparable([ok, bad], allow_invalid=True)
    flagged = chart_figure([ok, bad], banner=banner)
    (note,) = [t for t in flagged.texts if t.get_text().startswith("Not like for like:")]
    assert "invalid runs included" in note.get_text() and note.get_fontsize() >= 9
    plt.close(flagged)
    assert not any("like for like" in t.get_text() for t in fig.texts)
    one = chart_figure([run("one", ems("nq", "10"))])
    assert [t.get_text().split("\n")[0] for t in one.axes[0].get_xticklabels()] == ["nq"]  # no avg of one
    plt.close(one)


def test_html_and_paired_tables_flag_invalid_runs(tmp_path: Path) -> None:
    from html.parser import HTMLParser

    ok = run("ok", ems("nq", "0" * 10) + ems("hotpotqa", "1" * 10))
    bad = run("bad", ems("nq", "0" * 10, fails={0, 1}) + ems("hotpotqa", "1" * 10), model="m2")
    banner = check_comparable([ok, bad], allow_invalid=True)
    paths = build_report([ok, bad], tmp_path, banner=banner)
    md = paths["markdown"].read_text()
    assert "| bad (INVALID) − ok | model |" in md and "invalid runs included (--allow-invalid)" in md

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[list[str]] = []
            self.in_summary = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table":
                self.in_summary = dict(attrs).get("id") == "summary"
            if self.in_summary and tag == "tr":
                self.rows.append([])
            if self.in_summary and tag in ("td", "th"):
                self.rows[-1].append("")

        def handle_endtag(self, tag: str) -> None:
            if tag == "table":
                self.in_summary = False

        def handle_data(self, data: str) -> None:
            if self.in_summary and self.rows and self.rows[-1]:
                self.rows[-1][-1] += data

    p = Rows()
    p.feed(paths["html"].read_text())
    head, *body = p.rows
    assert len({len(r) for r in p.rows}) == 1  # the INVALID cell is in its own column, every row as wide
    assert head[-1] == "valid" and body[0][-1] == "yes" and body[1][-1].startswith("INVALID: 2/20 questions")
    assert body[1][head.index("nq")] == "0.000 [0.00, 0.28]failed 2/10 · excl. 0.000 · INVALID"


def test_backends_without_a_label_are_named_by_the_service(live_bm25_url: str) -> None:
    """sky/infer.yaml passes bare URLs: the column says what the service serves, from its own GET /."""
    from searchrl.infer.comparison import service_label
    from searchrl.infer.runs import _service_info, parse_backends

    assert parse_backends(f"{live_bm25_url},web=http://h:2") == [("", live_bm25_url), ("web", "http://h:2")]
    with pytest.raises(ConfigError, match=r"\[LABEL=\]http"):
        parse_backends("=http://h:1")
    assert service_label(_service_info(live_bm25_url, None)) == TINY_CORPUS.name.split(".")[0]
    assert service_label({"backend": "dense", "corpus": "wiki18"}) == "wiki18"
    assert service_label({"backend": "bm25", "corpus": "bundled"}) == "wiki-subset-10k"
    assert service_label({"backend": "google", "provider": "serper", "page_mode": False}) == "google-snippets"
    assert service_label({"backend": "google", "provider": "serpapi", "page_mode": True}) == "google-pages"
    hybrid = {"backend": "hybrid", "parts": [{"backend": "dense", "corpus": "wiki18"}, {"backend": "bm25"}]}
    assert service_label(hybrid) == "hybrid-wiki18"


def test_result_files_carry_wilson_intervals_for_em() -> None:
    """`searchrl eval`'s own summary (and so its printed table) uses Wilson for EM too: 30/30 is not [1, 1]."""
    r = run("all right", ems("nq", "1" * 30))
    assert r["per_dataset"]["nq"]["em_ci"] == list(wilson_ci(30, 30)) and r["summary"]["em_ci"][0] < 0.9


def test_matrix_names_bare_backends_with_the_services_token(
    bm25_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--backends URL` asks the (token-protected) service what it serves, with RETRIEVAL_API_KEY, and the run's
    label says so."""
    from pydantic import SecretStr

    from searchrl.errors import RetrievalUnavailableError
    from searchrl.infer import runs
    from searchrl.infer.settings import InferSettings
    from searchrl.retrieval.serving.app import create_app
    from tests.live import serve_in_thread

    seen: list[str] = []
    monkeypatch.setattr(runs, "run_eval", lambda s, progress=True: seen.append(s.label) or (Path("x"), {}))
    token = "compare-token-1234"
    with serve_in_thread(create_app(bm25_settings.model_copy(update={"api_key": SecretStr(token)}))) as url:
        base = InferSettings(retrieval_api_key=SecretStr(token))
        runs.run_matrix(base, [runs.ModelSpec("org/m")], runs.parse_backends(url), [True])
        with pytest.raises(RetrievalUnavailableError, match="401"):
            runs.run_matrix(InferSettings(), [runs.ModelSpec("org/m")], [("", url)], [True])
    assert seen == [f"m, {TINY_CORPUS.name.split('.')[0]}, search"]


def test_avg_flags_an_interval_that_disagrees_with_its_test() -> None:
    """At small n the stratified bootstrap can exclude 0 beside a randomization p of 0.0505: the cell says so."""
    base = run("a", ems("nq", "100111101101000100110110010101100") + ems("hotpotqa", "1000000"))
    new = run("b", ems("nq", "101001000010010111010111011001010") + ems("hotpotqa", "1111101"), model="m2")
    (c,) = contrasts([base, new])
    avg = c.tests[AVG]
    assert avg.ci[0] > 0 and 0.05 < avg.p_value < 0.051
    table = paired_markdown([c], [AVG])
    assert table.splitlines()[-1].endswith(" † |") and "†" not in contrast_cell(c, "nq")


def test_cells_do_not_depend_on_record_order() -> None:
    """A resumed run writes its records in another order; its cells and Avg. interval are the same."""
    qs = ems("hotpotqa", "10" * 20) + ems("nq", "1100110000" * 3, fails={4})
    a, b = run("a", qs), run("a", list(reversed(qs)))
    assert run_cells(a) == run_cells(b) and list(run_cells(a)) == ["nq", "hotpotqa", AVG]
