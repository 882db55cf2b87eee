"""searchrl/stats.py: bootstrap intervals and paired tests, checked against closed forms and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from searchrl.stats import bootstrap_ci, mcnemar_p, paired_comparison


def test_bootstrap_ci_matches_the_normal_approximation() -> None:
    x = np.r_[np.ones(300), np.zeros(700)]  # EM 0.3 over n=1000
    lo, hi = bootstrap_ci(x, n_boot=4000)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 1000)
    assert lo == pytest.approx(0.3 - half, abs=0.006) and hi == pytest.approx(0.3 + half, abs=0.006)
    assert bootstrap_ci(x) == bootstrap_ci(x)  # seeded: the same file prints the same interval
    assert bootstrap_ci([1.0] * 5) == (1.0, 1.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))


def test_thirty_questions_cannot_separate_close_runs() -> None:
    """The README's case: 30 dev questions, 0.933 vs 0.900 differ by one question."""
    a = [1.0] * 27 + [0.0] * 3
    b = [1.0] * 28 + [0.0] * 2
    c = paired_comparison(a, b)
    assert c.n == 30 and c.diff == pytest.approx(1 / 30) and (c.b_only, c.a_only) == (1, 0)
    assert c.p_value == 1.0 and not c.significant and c.ci[0] <= 0 <= c.ci[1]


def test_mcnemar_is_the_exact_binomial_on_discordant_pairs() -> None:
    assert mcnemar_p(12, 2) == pytest.approx(binomtest(12, 14, 0.5).pvalue)
    assert mcnemar_p(0, 0) == 1.0
    a = [0.0] * 40 + [1.0] * 60
    b = [1.0] * 15 + [0.0] * 25 + [1.0] * 60  # 15 fixed, none broken
    c = paired_comparison(a, b)
    assert c.significant and c.p_value == pytest.approx(binomtest(15, 15, 0.5).pvalue)
    assert c.diff == pytest.approx(0.15) and 0.08 < c.ci[0] < 0.15 < c.ci[1] < 0.23


def test_paired_needs_the_same_questions() -> None:
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison([1.0, 0.0], [1.0])
    f1 = paired_comparison([0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5])  # non-binary: bootstrap p
    assert f1.p_value == 1.0 and f1.diff == 0.0
