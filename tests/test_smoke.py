"""`searchrl smoke` (CI's smoke job) run here: the real serve process, health check and recall over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.smoke import Question, known_item_questions, run_smoke, score
from tests.conftest import DEV_QA, TINY_CORPUS


def test_known_item_questions_come_from_their_passages() -> None:
    questions = known_item_questions(TINY_CORPUS, 8)
    assert 4 <= len(questions) <= 8
    passages = {json.loads(line)["contents"] for line in TINY_CORPUS.read_text().splitlines()}
    for q in questions:
        (title,) = q.titles
        assert any(p.startswith(f'"{title}"\n') and q.text.split()[0] in p for p in passages)


def test_score_counts_any_supporting_title() -> None:
    qs = [Question("a", ("A",)), Question("b", ("B", "C")), Question("d", ("D",))]
    assert score(qs, [["A"], ["X", "C"], ["X"]]) == pytest.approx(2 / 3)


@pytest.mark.live
def test_smoke_on_a_corpus_file_serves_and_scores_known_items(tmp_path: Path) -> None:
    report = run_smoke(corpus=str(TINY_CORPUS), data_dir=tmp_path / "data", out_dir=tmp_path / "out")
    assert [s.name for s in report.steps] == ["download", "serve + health", "recall"], report.table()
    assert report.ok, report.table()
    assert report.questions >= 4 and report.recall is not None and report.recall >= 0.6


@pytest.mark.live
def test_smoke_fails_on_the_recall_floor(tmp_path: Path) -> None:
    """A QA file whose titles are not in the corpus: the run fails at recall, with the number."""
    qa = tmp_path / "qa.jsonl"
    rows = [{"id": str(i), "question": f"q {i}", "supporting_titles": ["Nowhere"]} for i in range(3)]
    qa.write_text("\n".join(json.dumps(r) for r in rows))
    report = run_smoke(corpus=str(TINY_CORPUS), qa=qa, data_dir=tmp_path / "data", out_dir=tmp_path / "out")
    assert not report.ok and report.steps[-1].name == "recall"
    assert "recall@3 0.000 on 3 questions" in report.steps[-1].detail


@pytest.mark.live
def test_cli_on_the_bundled_dev_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["smoke", "--qa", str(DEV_QA), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| recall | passed |" in table and "30 questions" in table
    saved = json.loads((out / "smoke.json").read_text())
    assert saved["ok"] and saved["recall"] >= 0.9  # bm25 on the dev set: 0.967 (make bench-quality)


def test_unreachable_hub_is_skipped_or_fails_never_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    out = tmp_path / "out"
    assert main(["smoke", "--corpus", "wiki18-100k", "--data-dir", str(tmp_path), "--out", str(out)]) == 0
    assert "| download | skipped |" in capsys.readouterr().out
    assert not (tmp_path / "corpora").exists()
    rc = main(["smoke", "--corpus", "wiki18-100k", "--require-download", "--out", str(out)])
    assert rc == 2
    assert "smoke step 'download' failed: Hub unreachable" in capsys.readouterr().err
