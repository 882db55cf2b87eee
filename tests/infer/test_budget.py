"""The web search budget an eval needs, printed (with its cost) before the run; the infer recipe uses it."""

from __future__ import annotations

import math

import pytest
import yaml

from searchrl.cli import main
from searchrl.infer.budget import plan_search_budget
from tests.conftest import REPO, TINY_QA


def test_worst_case_budget_and_cost() -> None:
    b = plan_search_budget(200 * 7, runs=2, max_turns=4, price_per_1k=1.0)
    assert b.requests == 2 * (1400 * 4 + 1) == 11202  # the old recipe's 100/day covered 0.9% of it
    assert b.cost == pytest.approx(11.21)
    assert "11202 requests at most" in b.describe()
    with pytest.raises(ValueError):
        plan_search_budget(0)


def test_cli_prints_the_number_on_stdout_and_the_cost_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval-budget", "--qa", str(TINY_QA), "--runs", "2", "--max-turns", "2", "--price-per-1k", "5"]
    assert main([*argv, "--queries-per-call", "1", "--health-queries", "0", "--retry-share", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(2 * (5 * 2 + 1))
    assert "at most 0.11" in err
    # the defaults count a query_list of 3 per call, the recipe's own health query and 10% for retries,
    # which the service's budget counts too
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(math.ceil((2 * (5 * 2 * 3 + 1) + 1) * 1.1)) == "70"
    assert "3 query(ies) per call" in err and "+1 health queries, +10% for retries" in err
    # search-r1 writes one query per <search>
    assert main([*argv, "--prompt-format", "search-r1"]) == 0
    assert capsys.readouterr().out.strip() == str(math.ceil((2 * (5 * 2 + 1) + 1) * 1.1))
    assert main(["eval-budget", "--qa", str(TINY_QA), "--runs", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: eval-budget:")


def test_infer_recipe_sizes_the_google_budget_and_records_a_cache() -> None:
    run = yaml.safe_load((REPO / "sky" / "infer.yaml").read_text())["run"]
    budget_at = run.index("searchrl eval-budget")
    google_at = run.index("searchrl serve --backend google")
    assert budget_at < google_at < run.index("searchrl compare")
    serve_line = run[run.rindex("\n", 0, google_at - 200) : google_at]
    assert 'SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET="$WEB_BUDGET"' in serve_line
    assert "SEARCHRL_RETRIEVAL_CACHE_MODE=record" in serve_line
    assert "GOOGLE_CSE_ID" not in (REPO / "sky" / "infer.yaml").read_text()
