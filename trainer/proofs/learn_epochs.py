"""The learning run's per-question evidence, read from verl's own rollout dumps: whole epochs, paired, no collapse.

A step's mean reward mixes questions whose reachable scores differ (each question's answer has its own letters:
one question's samples score ~0.25 where another's score ~0.6), so step-to-step swings are as large as the rise
and a window that holds some questions twice and others not at all compares different questions. This module
compares each train question with itself: its mean reward over the first epoch against the last epoch (every
question is sampled once an epoch, `rollout_n` times), over windows that are whole epochs by construction
(`epoch_steps` refuses the settings where they are not).

The scores come from the run itself: verl's `trainer.rollout_data_dir` writes `<step>.jsonl` per step with
each trajectory's decoded prompt (`input`), its reward (`score`, the reward worker's value, not the sabotaged
advantage's input) and its TransferQueue key (`uid`: `{prompt uid}_{sample}_{output}`; the prompt uid is the
GRPO group). The question is found in the prompt text.

Collapse: a GRPO group whose samples all score alike has zero advantage and gives no gradient. When every group
of the last epoch scores alike the policy has collapsed onto one output and the "learning" is over before the
window that measures it; `groups_varying` counts the share of groups per step whose scores differ.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from searchrl.errors import ConfigError, SmokeCheckError

VARY_EPS = 1e-9  # two scores of a group differ when they differ by more than float noise


@dataclass(frozen=True)
class Trajectory:
    """One sampled trajectory as verl dumped it: its step, its question, its GRPO group and its reward."""

    step: int
    question: str
    group: str
    score: float


def epoch_steps(train_rows: int, prompts_per_step: int, steps: int) -> int:
    """Steps per epoch; ConfigError unless the first and last `steps`' windows are whole, distinct epochs.

    verl batches the train rows with drop_last, so when `train_rows` is not a multiple of `prompts_per_step`
    each epoch leaves a different question out, and when `steps` is not a multiple of the epoch the last window
    holds some questions twice and others not at all: a paired comparison would then compare unlike windows.
    """
    if prompts_per_step < 1 or train_rows < prompts_per_step or train_rows % prompts_per_step:
        raise ConfigError(
            f"{train_rows} train rows do not split into whole steps of {prompts_per_step} prompts, so the "
            "first and last epochs would hold different questions: pick --questions so the train rows (the "
            f"questions minus the held-out sixth) are a multiple of {prompts_per_step}, e.g. --questions 12"
        )
    epoch = train_rows // prompts_per_step
    if steps % epoch or steps < 2 * epoch:
        raise ConfigError(
            f"{steps} steps are not a whole number (at least 2) of {epoch}-step epochs ({train_rows} train rows, "
            f"{prompts_per_step} prompts a step), so the first and last epochs cannot be compared question by "
            "question: pick --questions so the epoch divides the steps, e.g. --questions 12 (10 train rows)"
        )
    return epoch


def read_dumps(rollout_dir: Path, questions: Sequence[str]) -> list[Trajectory]:
    """Every trajectory of verl's `<step>.jsonl` dumps, each tied to the one question whose text its prompt holds."""
    files = sorted(
        rollout_dir.glob("*.jsonl"), key=lambda path: int(path.stem) if path.stem.isdigit() else -1
    )
    if not files:
        raise SmokeCheckError(f"verl wrote no rollout dump under {rollout_dir} (trainer.rollout_data_dir)")
    out = []
    for path in files:
        # split on "\n" only: verl writes each row with ensure_ascii=False, and a random model's output can hold
        # U+0085 or U+2028, where str.splitlines would cut a row in two (a shuffle_rewards run hit U+0085)
        for line in path.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            row = json.loads(line)
            found = [q for q in questions if q in row["input"]]
            if len(found) != 1:
                raise SmokeCheckError(
                    f"{path}: a prompt holds {len(found)} of the run's train questions, not one: "
                    f"{row['input'][-200:]!r}"
                )
            group = str(row["uid"]).rsplit("_", 2)[0]
            out.append(Trajectory(int(row["step"]), found[0], group, float(row["score"])))
    return out


def groups_varying(trajectories: Iterable[Trajectory]) -> dict[int, float]:
    """Per step, the share of its GRPO groups whose samples did not all score alike (the groups with a gradient)."""
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for t in trajectories:
        groups[(t.step, t.group)].append(t.score)
    by_step: dict[int, list[bool]] = defaultdict(list)
    for (step, _), scores in groups.items():
        by_step[step].append(max(scores) - min(scores) > VARY_EPS)
    return {step: sum(vary) / len(vary) for step, vary in sorted(by_step.items())}


@dataclass(frozen=True)
class PairedRise:
    """Each question's mean reward over the first epoch and over the last, the same questions in both."""

    first: dict[str, float]
    last: dict[str, float]
    what: str = "first epoch -> last"  # what `first` and `last` are (the async runs compare groups)
    left_out: int = 0  # questions with nothing to compare (an async run's question trained in one group only)

    @property
    def rises(self) -> dict[str, float]:
        return {q: self.last[q] - self.first[q] for q in self.first}

    @property
    def mean_rise(self) -> float:
        return statistics.fmean(self.rises.values()) if self.first else math.nan

    @property
    def rose(self) -> int:
        return sum(rise > 0 for rise in self.rises.values())

    def line(self) -> str:
        return (
            f"per question ({self.what}, paired): {statistics.fmean(self.first.values()):.3f} -> "
            f"{statistics.fmean(self.last.values()):.3f} ({self.mean_rise:+.3f}), {self.rose} of "
            f"{len(self.first)} rose"
            + (f" ({self.left_out} trained once, left out)" if self.left_out else "")
        )


def paired_rise(trajectories: Sequence[Trajectory], epoch: int, steps: int) -> PairedRise:
    """First epoch (steps 1..epoch) vs last (steps-epoch+1..steps), per question; SmokeCheckError unless both
    windows hold the same questions, each sampled the same number of times (what `epoch_steps` promises)."""
    windows = {"first": range(1, epoch + 1), "last": range(steps - epoch + 1, steps + 1)}
    means: dict[str, dict[str, float]] = {}
    for name, window in windows.items():
        scores: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            if t.step in window:
                scores[t.question].append(t.score)
        counts = {len(s) for s in scores.values()}
        if len(counts) > 1:
            raise SmokeCheckError(
                f"the {name} epoch (steps {window.start}-{window.stop - 1}) sampled its questions unequally "
                f"({sorted(counts)} trajectories each): the paired comparison would weigh them unequally"
            )
        means[name] = {q: statistics.fmean(s) for q, s in scores.items()}
    if set(means["first"]) != set(means["last"]) or not means["first"]:
        raise SmokeCheckError(
            f"the first and last epochs sampled different questions ({len(means['first'])} and "
            f"{len(means['last'])}; {len(set(means['first']) ^ set(means['last']))} in only one)"
        )
    return PairedRise(means["first"], means["last"])


def paired_first_last_group(trajectories: Sequence[Trajectory]) -> PairedRise:
    """Per question, the mean reward of its first trained GRPO group and of its last (an async run's comparison).

    In verl's async modes a step trains whichever groups finished first (one prompt per dataloader fetch, stale
    groups evicted and refilled), so a 5-step window no longer holds each question once: the first run in
    separate_async trained two questions twice and two not at all in its last 5 steps. Each question is still
    drawn once an epoch, so its first group is from the first epoch's draw and its last from the latest it was
    trained on; in a sync run that is exactly the first and last epoch (`paired_rise`). A question trained in one
    group only has no rise to measure and is left out, and said so (`PairedRise.left_out`): evicted groups are
    not refilled with the same question, so in 20 steps of seed 1 one question of 10 was trained once (at step
    14, its other draws evicted). SmokeCheckError when more than half the questions were trained once: the
    comparison would then speak for the few."""
    groups: dict[str, dict[tuple[int, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trajectories:
        groups[t.question][(t.step, t.group)].append(t.score)
    once = sorted(q for q, found in groups.items() if len(found) < 2)
    if not groups or 2 * len(once) > len(groups):
        raise SmokeCheckError(
            f"{len(once)} of {len(groups)} questions were trained in fewer than two groups: no first and last to "
            "compare for most of them"
        )
    first, last = {}, {}
    for question, found in groups.items():
        if question in once:
            continue
        keys = sorted(found)
        first[question] = statistics.fmean(found[keys[0]])
        last[question] = statistics.fmean(found[keys[-1]])
    return PairedRise(first, last, "first group -> last", left_out=len(once))


__all__ = [
    "VARY_EPS",
    "PairedRise",
    "Trajectory",
    "epoch_steps",
    "groups_varying",
    "paired_first_last_group",
    "paired_rise",
    "read_dumps",
]
