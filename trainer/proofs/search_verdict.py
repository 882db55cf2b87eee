"""`make learn-search`'s verdict: did the trained model learn to SEARCH, on held-out questions?

Reward can rise without search (DESIGN.md 3f: a published verl search run reached 0.93 reward with zero tool
calls), and a 0/1 reward on a few hundred questions is noisy, so the verdict is paired and interval-based, per
held-out question, base model against trained model (the same questions, greedy decoding, the same eval code):

1. **EM with search rose**: the paired difference trained - base has a 95% interval above zero (the exact
   McNemar interval of `searchrl.stats.mcnemar_ci`, consistent with the report's McNemar test);
2. **its own search found the answer more often**: the share of episodes whose tool responses hold a golden
   answer (`answer_in_observation`, infer/summary.py) rose with its paired interval above zero;
3. **the gain is search's**: with search switched off the trained model's EM gain over the base model (also
   search off) is less than `MAX_OFF_SHARE` of the gain with search on, and the trained model's EM with search
   beats its own EM without (paired interval above zero);
4. **not noise of the update**: when the shuffled-reward null ran (the same run with each step's rewards
   permuted among its trajectories, trainer/cpu/sabotage.py `shuffle_rewards`), the trained model's EM with
   search is above the null model's (paired interval above zero).

All must hold for `learned to search` (exit 0); otherwise the run prints what was measured and exits 2.
Searches per episode are reported beside them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchrl.errors import ConfigError
from searchrl.scoring import cover_match

MAX_OFF_SHARE = 0.5  # the search-off gain must be under half the search-on gain
VERDICT_OK = "learned to search"


@dataclass(frozen=True)
class Arm:
    """One eval run's per-question outcomes, in the held-out set's order."""

    label: str
    em: list[float]
    found: list[bool]  # answer_in_observation
    searches: list[float]
    # the answer's token F1 (Search-R1's `f1`), reported beside EM and never judged: an answer that names the title
    # inside a sentence (run 10's trained samples) scores EM 0 and F1 above 0
    f1: list[float] = field(default_factory=list)
    # the answer holds a golden answer as whole words (searchrl.scoring.cover_match), reported the same way
    covers: list[bool] = field(default_factory=list)

    @classmethod
    def from_records(cls, label: str, records: Mapping[str, Mapping[str, Any]], order: Sequence[str]) -> Arm:
        """From `searchrl eval`'s records keyed by question; ConfigError when a question is missing."""
        missing = [q for q in order if q not in records]
        if missing:
            raise ConfigError(
                f"{label}: {len(missing)} held-out questions have no record, e.g. {missing[0]!r}"
            )
        rows = [records[q] for q in order]
        return cls(
            label,
            [float(r.get("em", 0.0)) for r in rows],
            [bool(r.get("answer_in_observation")) for r in rows],
            [float(r.get("searches", 0)) for r in rows],
            [float(r.get("f1", 0.0)) for r in rows],
            [bool(cover_match(str(r.get("answer") or ""), r.get("golden_answers") or [])) for r in rows],
        )

    @property
    def n(self) -> int:
        return len(self.em)

    def mean(self) -> float:
        return statistics.fmean(self.em) if self.em else 0.0

    def found_share(self) -> float:
        return sum(self.found) / len(self.found) if self.found else 0.0

    def searches_mean(self) -> float:
        return statistics.fmean(self.searches) if self.searches else 0.0

    def f1_mean(self) -> float:
        return statistics.fmean(self.f1) if self.f1 else math.nan

    def cover_share(self) -> float:
        return sum(self.covers) / len(self.covers) if self.covers else math.nan


@dataclass(frozen=True)
class Paired:
    """A paired difference of two 0/1 outcomes over the same questions, with its exact 95% interval."""

    diff: float
    low: float
    high: float
    gained: int  # questions right in the second, wrong in the first
    lost: int

    def text(self) -> str:
        return f"{self.diff:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (+{self.gained}/-{self.lost})"


def paired(first: Sequence[float] | Sequence[bool], second: Sequence[float] | Sequence[bool]) -> Paired:
    """second - first, per question (0/1 each), with `mcnemar_ci`'s interval."""
    from searchrl.stats import mcnemar_ci

    if len(first) != len(second) or not first:
        raise ConfigError(
            f"paired outcomes need the same non-empty questions ({len(first)} vs {len(second)})"
        )
    gained = sum(1 for a, b in zip(first, second, strict=True) if b and not a)
    lost = sum(1 for a, b in zip(first, second, strict=True) if a and not b)
    low, high = mcnemar_ci(gained, lost, len(first))
    return Paired((gained - lost) / len(first), low, high, gained, lost)


@dataclass(frozen=True)
class Verdict:
    """The measured figures and the criteria that missed (empty: it learned to search)."""

    em: Paired
    found: Paired
    on_vs_off: Paired
    gain_on: float
    gain_off: float
    null: Paired | None
    problems: list[str]

    @property
    def learned(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.learned:
            return (
                f"{VERDICT_OK}: held-out EM with search {self.em.text()}, answer retrieved by its own search "
                f"{self.found.text()}, gain with search off {self.gain_off:+.3f} vs on {self.gain_on:+.3f}"
            )
        return "did NOT learn to search: " + "; ".join(self.problems)


def judge(
    base_on: Arm, trained_on: Arm, base_off: Arm, trained_off: Arm, null_on: Arm | None = None
) -> Verdict:
    """The module docstring's criteria on the four (five with the null) arms of the same held-out questions."""
    n = base_on.n
    if any(arm.n != n for arm in (trained_on, base_off, trained_off, *([null_on] if null_on else []))):
        raise ConfigError("every arm must cover the same held-out questions")
    em = paired(base_on.em, trained_on.em)
    found = paired(base_on.found, trained_on.found)
    on_vs_off = paired(trained_off.em, trained_on.em)
    gain_on = trained_on.mean() - base_on.mean()
    gain_off = trained_off.mean() - base_off.mean()
    null = paired(null_on.em, trained_on.em) if null_on is not None else None
    problems = []
    if not em.low > 0:
        problems.append(f"EM with search did not rise beyond noise: {em.text()} on {n} held-out questions")
    if not found.low > 0:
        problems.append(f"answer retrieval by its own search did not rise: {found.text()}")
    if not (gain_on > 0 and gain_off < MAX_OFF_SHARE * gain_on):
        problems.append(
            f"the gain does not depend on search: {gain_off:+.3f} with search off vs {gain_on:+.3f} on "
            f"(needs under {MAX_OFF_SHARE:.0%} of it)"
        )
    if not on_vs_off.low > 0:
        problems.append(f"the trained model is not better with search than without: {on_vs_off.text()}")
    if null is not None and not null.low > 0:
        problems.append(f"not above the shuffled-reward null: trained - null EM {null.text()}")
    return Verdict(em, found, on_vs_off, gain_on, gain_off, null, problems)


def table(arms: Sequence[Arm]) -> str:
    """One row per arm: n, EM with its Wilson interval, answer retrieved, searches per episode."""
    from searchrl.stats import wilson_ci

    lines = [
        "| run | n | EM [95% Wilson] | answer in its own search results [95% Wilson] | searches / episode | "
        "answer F1 (mean) | answer holds a golden answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        k, f = round(sum(arm.em)), sum(arm.found)
        em_lo, em_hi = wilson_ci(k, arm.n)
        f_lo, f_hi = wilson_ci(f, arm.n)
        lines.append(
            f"| {arm.label} | {arm.n} | {arm.mean():.3f} [{em_lo:.3f}, {em_hi:.3f}] | "
            f"{arm.found_share():.3f} [{f_lo:.3f}, {f_hi:.3f}] | {arm.searches_mean():.2f} | {arm.f1_mean():.3f} | "
            f"{arm.cover_share():.3f} |"
        )
    return "\n".join(lines)


__all__ = ["MAX_OFF_SHARE", "VERDICT_OK", "Arm", "Paired", "Verdict", "judge", "paired", "table"]
