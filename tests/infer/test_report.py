"""`searchrl compare`: two scripted models x two live backends (dense, BM25) x search on/off into one report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.errors import ConfigError, DataError
from searchrl.infer.report import disagreements
from searchrl.infer.runs import load_runs, parse_backends, parse_models, parse_tools
from searchrl.stats import wilson_ci
from tests.conftest import TINY_QA
from tests.infer.conftest import serve_scripts
from tests.infer.test_agent import TRAINED

# The base model answers from memory and never searches; two of its answers are wrong.
BASE = {
    "game of chess": ["<think>I remember this film.</think>\n<answer> Ingmar Bergman </answer>"],
    "Ming and Qing": ["<think>Ming had 16 emperors.</think>\n<answer> 16 </answer>"],
    "Shlomo Yitzchaki": ["<think>Known.</think>\n<answer> Rashi </answer>"],
    "fractal": ["<think>Known.</think>\n<answer> Benoit Mandelbrot </answer>"],
    "Charles Babbage": [
        "<think>Babbage designed the difference engine.</think>\n<answer> difference engine </answer>"
    ],
}


class _SummaryTable(HTMLParser):
    """Collects {run label: {column: cell text}} from <table id='summary'>."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._in_table = False
        self._run: str | None = None
        self._col: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "summary":
            self._in_table = True
        elif self._in_table and tag == "tr" and a.get("data-run"):
            self._run = a["data-run"]
            self.rows[self._run] = {}
        elif self._in_table and tag == "td" and a.get("data-col"):
            self._col = a["data-col"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_table = False
        elif tag == "td":
            self._col = None

    def handle_data(self, data: str) -> None:
        if self._run and self._col:
            self.rows[self._run][self._col] = self.rows[self._run].get(self._col, "") + data


@pytest.fixture(scope="module")
def live_dense_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.live import serve_tiny_service

    # autotune off: the report is under test, not the encoder's tuning (tests/retrieval/encoders/)
    with serve_tiny_service(tmp_path_factory.mktemp("dense"), backend="dense", autotune=False) as url:
        yield url


@pytest.mark.live
@pytest.mark.slow
def test_compare_matrix_report(
    live_bm25_url: str,
    live_dense_url: str,
    chat_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results, out = tmp_path / "results", tmp_path / "report"
    for llm_url, _ in serve_scripts({"org/base-3b": BASE, "ckpt/trained-3b": TRAINED}):
        rc = main(
            [
                "compare",
                "--models", f"org/base-3b@{llm_url},ckpt/trained-3b@{llm_url}",
                "--backends", f"dense={live_dense_url},bm25={live_bm25_url}",
                "--tools", "on,off",
                "--qa", str(TINY_QA),
                "--tokenizer", str(chat_tokenizer_dir),
                "--max-turns", "2",
                "--output-dir", str(results),
                "--out", str(out),
                "--title", "base vs trained",
            ]
        )  # fmt: skip
    assert rc == 0
    runs = load_runs([results])
    labels = sorted(r["protocol"]["label"] for r in runs)
    assert labels == sorted(
        f"{m}, {b}, {s}"
        for m in ("base-3b", "trained-3b")
        for b, s in (("dense", "search"), ("bm25", "search"), ("none", "no-search"))
    )
    backends = {r["protocol"]["label"]: r["protocol"]["retrieval"]["backend"] for r in runs}
    assert backends["trained-3b, dense, search"] == "dense" and backends["trained-3b, bm25, search"] == "bm25"

    html_text = (out / "report.html").read_text()
    assert (
        "data:image/png;base64," in html_text and 'src="http' not in html_text and "<script" not in html_text
    )
    table = _SummaryTable()
    table.feed(html_text)
    assert set(table.rows) == set(labels)
    for r in runs:  # every number in the HTML table is the one in the JSON result, with its Wilson interval
        row = table.rows[r["protocol"]["label"]]
        dev = r["per_dataset"]["dev"]
        lo, hi = wilson_ci(round(dev["em"] * 5), 5)
        assert row["dev"] == f"{dev['em']:.3f} [{lo:.2f}, {hi:.2f}]failed 0/5"  # failed/n in every cell
        assert dev["n"] == 5 and lo <= dev["em"] <= hi
        assert "avg" not in row  # one dataset: no Avg. column
        assert row["searches"] == f"{r['summary']['searches']:.3f}"
        assert row["n"] == "5" and row["valid"] == "yes"
        assert row["failed"] == "0" and row["llm_errors"] == "0"
        # the model's own mistakes are shown apart from failures (the trained script writes one bad call)
        assert row["model_behaviour"].split()[0] == str(sum(r["summary"]["model_errors"].values()))
    em = {label: float(row["dev"].split()[0]) for label, row in table.rows.items()}
    # four runs tie at 0.600 (n=5): none is bolded, as no run is significantly better than all others
    assert "num best" not in html_text
    assert em["trained-3b, bm25, search"] == 0.6 and em["base-3b, none, no-search"] == 0.6
    assert em["trained-3b, none, no-search"] == 0.2  # it only answers q013 without a tool
    # the same scripted turns over either backend: same searches (3 questions search 1, 2 and 2 times)
    assert (
        table.rows["trained-3b, dense, search"]["searches"]
        == table.rows["trained-3b, bm25, search"]["searches"]
        == "1.000"
    )

    # questions where the runs disagree are shown side by side with transcripts
    dis = {key for key, _ in disagreements(runs)}
    assert "dev/q008" in dis and "dev/q013" not in dis
    assert "id='q-dev/q008'" in html_text and "(Title: Forbidden City)" in html_text

    md = (out / "report.md").read_text()
    assert md.startswith("# base vs trained")
    assert "| trained-3b, bm25, search | 0.600 [0.23, 0.88] · failed 0/5 |" in md
    assert "| run | dev EM | F1 | searches/q | format ok | search failures | model behaviour |" in md
    assert "## Paired comparisons" in md and "McNemar's exact test" in md and "Not like for like" not in md
    # the contrasts a paper needs, not every run against the alphabetically first: trained - base per retrieval
    assert "| trained-3b, bm25, search − base-3b, bm25, search | model |" in md
    assert "| trained-3b, dense, search − trained-3b, none, no-search | search |" in md
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert "| run | dev EM | F1 |" in capsys.readouterr().out


def test_compare_over_existing_files_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "none.json")]) == 2
    assert "run `searchrl eval` first" in capsys.readouterr().err
    (tmp_path / "x.json").write_text(json.dumps({"protocol": {}}))
    with pytest.raises(DataError, match="not a `searchrl eval` result"):
        load_runs([tmp_path])
    assert main(["compare"]) == 2
    with pytest.raises(ConfigError):
        parse_models("m@ftp://x")
    with pytest.raises(ConfigError, match="share the name"):
        parse_models("a/ckpt@http://h:1/v1,b/ckpt@http://h:2/v1")
    with pytest.raises(ConfigError):
        parse_backends("dense")
    with pytest.raises(ConfigError):
        parse_tools("maybe")
    assert parse_models("a,b@http://h:1/v1")[1].url == "http://h:1/v1"
