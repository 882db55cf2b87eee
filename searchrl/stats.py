"""Intervals and paired tests for evaluation numbers, so a table says how much a difference could be chance.

- `wilson_ci`: the Wilson score interval of a proportion (EM, recall: 0/1 per question). At small n the
  percentile bootstrap is wrong for these: it prints [1.00, 1.00] at 30/30 and covers a p=.95 rate only ~78% of
  the time at n=30; Wilson keeps close to its nominal 95% at any n.
- `bootstrap_ci`: percentile bootstrap of a mean (F1, any score), 95% by default.
- `paired_comparison`: two runs over the *same* questions. For 0/1 metrics the p-value is McNemar's exact test
  (scipy.stats.binomtest of b vs c discordant pairs) and the interval's bound on zero's side is its exact
  conditional bound (the Clopper-Pearson interval of b/(b+c) scaled by (b+c)/n), so the interval excludes 0
  exactly when McNemar's p < 0.05 and a table never prints an interval that disagrees with the p beside it (5
  fixed, 0 broken of 30: p=0.0625 and an interval that includes 0). The far bound is the wider of that and the
  paired bootstrap's. Other metrics: paired bootstrap interval and bootstrap p.
- `macro_ci` / `macro_paired`: the paper's Avg. (unweighted mean over datasets). Stratified bootstrap (resample
  within each dataset) for the interval; the paired test of the macro difference is a stratified sign-flip
  randomization test (exact when small, else 50,000 seeded draws), which for one dataset is McNemar's exact
  test. Not McNemar on the pooled questions: that weights datasets by size and tests another quantity.
- `holm`: Holm's step-down adjustment over a family of p-values (many columns, many contrasts).

Every resampling works on counts, not on per-question copies: a 0/1 metric's bootstrap mean is a binomial draw,
any other metric's a multinomial over its distinct values. 2,000 resamples of 51,713 questions take a few
megabytes and milliseconds instead of the 1.65 GB an index matrix took. Resampling is seeded, so the same
result file always prints the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Scores = Sequence[float] | np.ndarray  # one score per question, as a list or an array

N_BOOT = 2000
N_PERM = 50_000  # sign-flip draws for the macro test when exact enumeration is too large
LEVEL = 0.95
_CHUNK_CELLS = 4_000_000  # resamples x distinct values held at once (32 MB of float64)
_EXACT_SUPPORT = 200_000  # enumerate the sign-flip distribution exactly up to this many outcomes


def _is_binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0.0) | (x == 1.0)))


def wilson_ci(k: int, n: int, *, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (nan, nan) when n is 0."""
    if n <= 0:
        return float("nan"), float("nan")
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - level) / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at k = 0 or k = n one bound is exactly 0 or 1 (rounding leaves 0.9999999999999999)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def proportion_ci(values: Sequence[float], *, level: float = LEVEL) -> tuple[float, float]:
    """Interval of a mean: Wilson for 0/1 values, percentile bootstrap for anything else."""
    x = np.asarray(values, dtype=float)
    if x.size and _is_binary(x):
        return wilson_ci(int(x.sum()), int(x.size), level=level)
    return bootstrap_ci(x, level=level)


def bootstrap_means(values: Scores, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """`n_boot` means of resamples (with replacement, same size) of `values`, drawn as counts.

    The mean of n resampled values only depends on how often each distinct value is drawn: a binomial count for
    0/1 values, a multinomial over the distinct values otherwise (chunked so memory stays bounded).
    """
    x = np.asarray(values, dtype=float)
    n = x.size
    uniq, counts = np.unique(x, return_counts=True)
    if uniq.size == 1:
        return np.full(n_boot, uniq[0])
    if uniq.size == 2:  # one binomial count per resample
        hits = rng.binomial(n, counts[1] / n, size=n_boot)
        return np.asarray((uniq[0] * (n - hits) + uniq[1] * hits) / n, dtype=float)
    probs = counts / n
    out = np.empty(n_boot)
    step = max(1, _CHUNK_CELLS // uniq.size)
    for start in range(0, n_boot, step):
        stop = min(n_boot, start + step)
        out[start:stop] = rng.multinomial(n, probs, size=stop - start) @ uniq / n
    return out


def bootstrap_ci(
    values: Scores, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values`; (nan, nan) when there are none."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    means = bootstrap_means(x, n_boot, np.random.default_rng(seed))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def macro_ci(
    groups: Sequence[Sequence[float]], *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Stratified percentile bootstrap of the unweighted mean of group means (the paper's Avg.).

    Each group (dataset) is resampled within itself, at its own size, so a 125-question dataset moves the
    average as much as a 3,610-question one, as it does in the average itself.
    """
    kept = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not kept:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.mean([bootstrap_means(g, n_boot, rng) for g in kept], axis=0)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class PairedComparison:
    """Run B minus run A over the questions both answered."""

    n: int  # paired questions
    diff: float  # mean(B) - mean(A)
    ci: tuple[float, float]  # interval of diff (see the module docstring for which one)
    b_only: int  # questions B got right and A wrong (0/1 metrics)
    a_only: int  # questions A got right and B wrong
    p_value: float  # McNemar exact (0/1), sign-flip randomization (macro), or paired-bootstrap p (others)
    method: str = "mcnemar"  # mcnemar | randomization | bootstrap

    @property
    def significant(self) -> bool:
        return self.p_value < 1 - LEVEL


def mcnemar_p(b: int, c: int) -> float:
    """Exact McNemar p-value for b and c discordant pairs (1.0 when there are none)."""
    if b + c == 0 or b == c:
        return 1.0
    from scipy.stats import binom

    # scipy's binomtest(b, b + c, 0.5) two-sided, in closed form: under p = 1/2 the distribution is symmetric, so
    # the outcomes at most as likely as the observed one are the two tails. binomtest searches for the other tail
    # and takes about a second at 5,000 discordant pairs; the report makes hundreds of these tests.
    return float(min(1.0, 2 * binom.cdf(min(b, c), b + c, 0.5)))


def mcnemar_ci(b: int, c: int, n: int, *, level: float = LEVEL) -> tuple[float, float]:
    """Exact conditional interval of the paired difference (b - c) / n, consistent with `mcnemar_p`.

    Given m = b + c discordant questions, b ~ Binomial(m, pi) and the difference is m (2 pi - 1) / n; the
    Clopper-Pearson interval of pi maps onto it. Under pi = 1/2 the two-sided exact p is twice one tail, and
    Clopper-Pearson puts alpha/2 in each tail, so the interval excludes 0 exactly when p < 1 - level.
    With no discordant question the difference is 0 and so is the interval.
    """
    m = b + c
    if m == 0:
        return 0.0, 0.0
    from scipy.stats import beta

    # Clopper-Pearson through the beta quantiles (what binomtest().proportion_ci(method="exact") solves for
    # with a root finder, 20 ms a call)
    alpha = 1 - level
    low = 0.0 if b == 0 else float(beta.ppf(alpha / 2, b, m - b + 1))
    high = 1.0 if b == m else float(beta.ppf(1 - alpha / 2, b + 1, m - b))
    return m * (2 * low - 1) / n, m * (2 * high - 1) / n


def paired_comparison(
    a: Scores, b: Scores, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> PairedComparison:
    """Compare two runs question by question; `a` and `b` hold one score per shared question, same order."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.shape != xb.shape:
        raise ValueError("paired scores need the same questions in the same order")
    if xa.size == 0:
        return PairedComparison(0, float("nan"), (float("nan"), float("nan")), 0, 0, float("nan"))
    d = xb - xa
    b_only = int(np.sum(xb > xa))
    a_only = int(np.sum(xa > xb))
    boots = bootstrap_means(d, n_boot, np.random.default_rng(seed))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    if _is_binary(xa) and _is_binary(xb):
        # The bound on zero's side is McNemar's exact one (it decides whether 0 is excluded); the far bound is the
        # wider of it and the bootstrap's, since the conditional interval never reaches past (b + c) / n.
        c_lo, c_hi = mcnemar_ci(b_only, a_only, int(d.size), level=level)
        if b_only >= a_only:
            c_hi = max(c_hi, float(hi))
        if b_only <= a_only:
            c_lo = min(c_lo, float(lo))
        return PairedComparison(
            int(d.size), float(d.mean()), (c_lo, c_hi), b_only, a_only, mcnemar_p(b_only, a_only)
        )
    # two-sided bootstrap p: how often the resampled difference lands on the other side of zero
    p = min(1.0, 2 * min(float(np.mean(boots <= 0)), float(np.mean(boots >= 0)))) if d.any() else 1.0
    return PairedComparison(
        int(d.size), float(d.mean()), (float(lo), float(hi)), b_only, a_only, p, "bootstrap"
    )


def _flip_distribution(diffs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact sign-flip distribution of sum_g mean(s_i d_i) / G as (values, probabilities), or None if too big.

    Within a group only the count of positive signs per distinct |d| matters: Binomial(count, 1/2).
    """
    from scipy.stats import binom

    parts = []
    size = 1
    for d in diffs:
        mags, counts = np.unique(np.abs(d[d != 0]), return_counts=True)
        for v, m in zip(mags, counts, strict=True):
            size *= int(m) + 1
            if size > _EXACT_SUPPORT:
                return None
            k = np.arange(m + 1)
            parts.append((v * (2 * k - m) / d.size / len(diffs), binom.pmf(k, m, 0.5)))
    values, probs = np.zeros(1), np.ones(1)
    for v, p in parts:
        values = (values[:, None] + v[None, :]).ravel()
        probs = (probs[:, None] * p[None, :]).ravel()
    return values, probs


def _flip_draws(diffs: Sequence[np.ndarray], n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """`n_perm` sign-flip draws of the macro difference, as binomial counts per distinct |d| per group."""
    total = np.zeros(n_perm)
    for d in diffs:
        mags, counts = np.unique(np.abs(d[d != 0]), return_counts=True)
        for v, m in zip(mags, counts, strict=True):
            pos = rng.binomial(int(m), 0.5, size=n_perm)
            total += v * (2 * pos - int(m)) / d.size
    return total / len(diffs)


def macro_paired(
    a_groups: Sequence[Scores],
    b_groups: Sequence[Scores],
    *,
    n_boot: int = N_BOOT,
    n_perm: int = N_PERM,
    level: float = LEVEL,
    seed: int = 0,
) -> PairedComparison:
    """B minus A on the unweighted mean over groups (datasets); groups hold the paired scores, same order.

    Interval: stratified paired bootstrap. p: stratified sign-flip randomization test (under "A and B are
    exchangeable on every question" each paired difference keeps its size and flips its sign with
    probability 1/2), exact when the distribution is small enough to enumerate. With one group both are
    `paired_comparison`'s (McNemar's exact p and its interval).
    """
    pairs = [
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float))
        for a, b in zip(a_groups, b_groups, strict=True)
    ]
    if any(a.shape != b.shape for a, b in pairs):
        raise ValueError("paired scores need the same questions in the same order")
    pairs = [(a, b) for a, b in pairs if a.size]
    if len(pairs) == 1:
        return paired_comparison(pairs[0][0], pairs[0][1], n_boot=n_boot, level=level, seed=seed)
    if not pairs:
        return PairedComparison(0, float("nan"), (float("nan"), float("nan")), 0, 0, float("nan"))
    diffs = [b - a for a, b in pairs]
    observed = float(np.mean([d.mean() for d in diffs]))
    rng = np.random.default_rng(seed)
    boots = np.mean([bootstrap_means(d, n_boot, rng) for d in diffs], axis=0)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    tol = 1e-12
    exact = _flip_distribution(diffs)
    if not any(d.any() for d in diffs):
        p = 1.0
    elif exact is not None:
        values, probs = exact
        p = float(min(1.0, probs[np.abs(values) >= abs(observed) - tol].sum()))
    else:
        draws = _flip_draws(diffs, n_perm, rng)
        p = float((1 + np.sum(np.abs(draws) >= abs(observed) - tol)) / (n_perm + 1))
    return PairedComparison(
        sum(d.size for d in diffs),
        observed,
        (float(lo), float(hi)),
        sum(int(np.sum(b > a)) for a, b in pairs),
        sum(int(np.sum(a > b)) for a, b in pairs),
        p,
        "randomization",
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; nan stays nan and is not counted)."""
    idx = [i for i, p in enumerate(p_values) if p == p]
    out = [float("nan")] * len(p_values)
    running = 0.0
    m = len(idx)
    for rank, i in enumerate(sorted(idx, key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


__all__ = [
    "Scores",
    "N_PERM",
    "LEVEL",
    "N_BOOT",
    "PairedComparison",
    "bootstrap_ci",
    "bootstrap_means",
    "holm",
    "macro_ci",
    "macro_paired",
    "mcnemar_ci",
    "mcnemar_p",
    "paired_comparison",
    "proportion_ci",
    "wilson_ci",
]
