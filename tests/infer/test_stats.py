"""searchrl/stats.py: bootstrap intervals and paired tests, checked against closed forms and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from searchrl.stats import (
    bootstrap_ci,
    holm,
    macro_ci,
    macro_paired,
    mcnemar_ci,
    mcnemar_p,
    paired_comparison,
    proportion_ci,
    wilson_ci,
)


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
    for b, c in [(0, 1), (3, 3), (7, 2), (2, 9), (40, 61), (2802, 2331)]:  # the closed form is scipy's test
        assert mcnemar_p(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9), (b, c)
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


def test_wilson_at_small_n_and_at_the_edges() -> None:
    """Percentile bootstrap printed [1.00, 1.00] at 30/30; Wilson does not collapse (closed form, z=1.96)."""
    lo, hi = wilson_ci(30, 30)
    assert hi == 1.0 and lo == pytest.approx(0.8865, abs=5e-4)
    lo, hi = wilson_ci(15, 30)
    assert (lo, hi) == (pytest.approx(0.3315, abs=5e-4), pytest.approx(0.6685, abs=5e-4))
    assert proportion_ci([1.0] * 30) == wilson_ci(30, 30)
    assert proportion_ci([0.5, 1.0]) == bootstrap_ci([0.5, 1.0])  # not 0/1: bootstrap
    assert all(math.isnan(v) for v in wilson_ci(0, 0))


def test_wilson_covers_about_95_percent_at_n30() -> None:
    """Exact coverage at n=30, p=.95 (the issue's case): Wilson near nominal, the old bootstrap at ~78%."""
    from scipy.stats import binom

    n, p = 30, 0.95
    cover = sum(binom.pmf(k, n, p) for k in range(n + 1) if wilson_ci(k, n)[0] <= p <= wilson_ci(k, n)[1])
    assert cover > 0.93


def test_mcnemar_interval_is_clopper_pearson() -> None:
    for b, c, n in [(5, 0, 30), (0, 4, 30), (7, 3, 50), (120, 95, 1000)]:
        ci = binomtest(b, b + c).proportion_ci(method="exact")
        lo, hi = mcnemar_ci(b, c, n)
        m = b + c
        assert (lo, hi) == (pytest.approx(m * (2 * ci.low - 1) / n), pytest.approx(m * (2 * ci.high - 1) / n))


def test_paired_interval_agrees_with_mcnemar() -> None:
    """5 fixed, 0 broken of 30: p=0.0625, so the interval must include 0 (the bootstrap's excluded it)."""
    a = [0.0] * 5 + [1.0] * 10 + [0.0] * 15
    b = [1.0] * 5 + [1.0] * 10 + [0.0] * 15
    c = paired_comparison(a, b)
    assert c.p_value == pytest.approx(0.0625) and c.ci[0] <= 0.0 <= c.ci[1] and not c.significant
    for b_only in range(0, 16):  # every split of up to 15 discordant questions among 40
        for a_only in range(0, 16 - b_only):
            xa = [1.0] * a_only + [0.0] * b_only + [0.0] * (40 - a_only - b_only)
            xb = [0.0] * a_only + [1.0] * b_only + [0.0] * (40 - a_only - b_only)
            pc = paired_comparison(xa, xb)
            excludes = pc.ci[0] > 0 or pc.ci[1] < 0
            assert excludes == (pc.p_value < 0.05), (b_only, a_only, pc)
            assert pc.ci[0] <= pc.diff <= pc.ci[1]


def test_bootstrap_by_counts_is_small_on_the_full_test_set() -> None:
    """51,713 questions: the index-matrix bootstrap peaked at 1.65 GB; counts need a few MB."""
    import tracemalloc

    rng = np.random.default_rng(0)
    em = (rng.random(51_713) < 0.4).astype(float)
    f1 = np.round(rng.random(51_713), 2)
    tracemalloc.start()
    bootstrap_ci(em), bootstrap_ci(f1), paired_comparison(em, em[::-1])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64e6
    lo, hi = bootstrap_ci(em)
    half = 1.96 * math.sqrt(em.mean() * (1 - em.mean()) / em.size)
    assert lo == pytest.approx(em.mean() - half, abs=1e-3) and hi == pytest.approx(em.mean() + half, abs=1e-3)


def test_macro_interval_is_stratified() -> None:
    """Avg. over a 30/30 and a 0/30 dataset: each resampled within itself, so the average never moves."""
    assert macro_ci([[1.0] * 30, [0.0] * 30]) == (0.5, 0.5)
    lo, hi = macro_ci([[1.0] * 20 + [0.0] * 10, [1.0] * 5 + [0.0] * 95])
    avg = (20 / 30 + 5 / 100) / 2
    assert lo < avg < hi and hi - lo < 0.2


def test_macro_test_is_mcnemar_for_one_dataset_and_a_randomization_test_otherwise() -> None:
    a, b = [0.0] * 5 + [1.0] * 25, [1.0] * 30
    one = macro_paired([a], [b])
    assert one == paired_comparison(a, b)
    # two datasets of different size: the macro difference weighs them equally, pooled McNemar does not
    small_a, small_b = [0.0] * 4 + [1.0] * 6, [1.0] * 10  # +0.4 on 10 questions
    big_a, big_b = [1.0] * 2 + [0.0] * 198, [0.0] * 2 + [0.0] * 198  # -0.01 on 200
    m = macro_paired([small_a, big_a], [small_b, big_b])
    assert m.method == "randomization" and m.diff == pytest.approx((0.4 - 0.01) / 2)
    # exact: sign flips of 4 discordant (weight 1/10) and 2 (weight 1/200) -> P(|T| >= 0.195) = P(all 4 agree)
    assert m.p_value == pytest.approx(2 / 16)
    assert (m.b_only, m.a_only, m.n) == (4, 2, 210)
    # too many outcomes to enumerate (601 x 601): 50,000 seeded draws. Two datasets of equal size weigh equally, so
    # the exact answer is McNemar on the pooled discordant pairs
    xa = [0.0] * 320 + [1.0] * 280 + [0.0] * 100
    xb = [1.0] * 320 + [0.0] * 280 + [0.0] * 100
    mc = macro_paired([xa, xa], [xb, xb])
    assert mc.p_value == pytest.approx(mcnemar_p(640, 560), abs=0.005) and 0.01 < mc.p_value < 0.05
    assert macro_paired([[1.0, 0.0]] * 2, [[1.0, 0.0]] * 2).p_value == 1.0


def test_holm() -> None:
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    adj = holm(p)  # sorted 0.005 0.01 0.03 0.04 -> x4 x3 x2 x1, then running maximum
    assert adj[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(adj[4])
