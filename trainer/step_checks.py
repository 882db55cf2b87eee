"""The step table of a training run, read from verl's console metrics, and the checks the CPU runs make.

verl's console logger prints one line per step, `step:N - key:value - key:value ...` (verl/utils/tracking.py),
which Ray prefixes with the actor's name. Reading that line, not a file of our own, means the table shows what a
GPU run's console (and W&B) shows, `search/*` and `loss/*` included (trainer/plugins/sampler.py adds those).

What each check catches (docs/cpu-proofs.md, "The loop learns"):
- **weight sync**: verl's `training/rollout_probs_diff_max`, the largest |p_rollout - p_actor| over the step's
  trained tokens, where p_rollout is what the rollout server sampled with and p_actor the trainer's recomputation
  under the weights it just synced. With actor, reference and rollout all in fp32 it is numerical noise; a
  rollout that kept older weights (a failed or skipped sync, or the initial weights after a resume) moves it far
  above `SYNC_MAX_PROB_DIFF`.
- **observations out of the loss**: `loss/observation_tokens_in_loss` must be 0 on every step, and
  `loss/observation_tokens` above 0 where the step searched (else the check saw no tool response at all).
- **the mask invariant**: loss mask 1 exactly on the tokens the rollout server generated, from the agent loop's
  record (trainer/plugins/generated_spans.py): `loss/mask_outside_generated`, `loss/mask_missing_in_generated` and
  `loss/unrecorded_trajectories` must be 0 (an unrecorded trajectory is an unchecked one, so it fails too).
- **rollouts that search**, no failed search, finite losses, every step logged once.
- **async modes** (`searchrl train cpu --trainer-mode colocate_async`): rollout log-probs of a trajectory sampled
  before an update come from older weights, so the probability-difference bound applies only to steps whose worst
  staleness (verl's `training/off_policy/trajectory_staleness_worst/max`) is 0. In its place: every step's
  `versions/*` (trainer/plugins/versions.py: stamped, within the staleness bound, each used version verified where
  the rollout servers keep a ledger). What the CPU run checks over its whole log (the engine's update lines, the
  resume) is its own: trainer/proofs/train_cpu.py `async_run_problems`.

A passing run says what its checks read (`checks_line`): the weight syncs whose fingerprint matched (one
`SYNC_MATCH_LINE` each in the run's log), the largest rollout/actor difference over the steps the sync bound
covered, the observation tokens in the loss and seen, and the mask invariant's counts. A check that never ran
(no matched sync, no step with the figure, no observation token on a run that searched, a missing metric) raises
instead of printing zeros.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchrl.errors import SearchRLError, StepCheckError
from searchrl.trainer.plugins import versions
from searchrl.trainer.plugins.generated_spans import MISSING, OUTSIDE, UNRECORDED
from searchrl.trainer.weight_sync.match_line import (
    SYNC_MATCH_LINE,
    SYNC_MATCH_PATTERN,
    sync_match_line,
    sync_matches,
)

# verl prints its rollout dump's "Dumped generations to <dir>/<N>.jsonl" without a newline, so the console
# logger's step line can follow it on the same line (seen in make learn-search, 2026-12-07)
STEP_LINE = re.compile(r"(?:^|\s|\.jsonl)step:(\d+) - (.*)$")
_NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)

# column: (header, verl metric key, format)
COLUMNS = {
    "trajectories": ("trajectories", "search/trajectories", "{:.0f}"),
    "search_calls": ("model searches", "search/model_calls", "{:.0f}"),
    "scripted_calls": ("scripted searches", "search/scripted_calls", "{:.0f}"),
    "search_failures": ("failed searches", "search/failures", "{:.0f}"),
    "reward": ("mean reward", "critic/score/mean", "{:.3f}"),
    "advantage_max": ("max advantage", "critic/advantages/max", "{:.3g}"),
    "response_length": ("response length", "response_length/mean", "{:.1f}"),
    "policy_loss": ("policy loss", "actor/pg_loss", "{:.4g}"),
    "grad_norm": ("grad norm", "actor/grad_norm", "{:.3g}"),
    "sync_diff": ("sync max prob diff", "training/rollout_probs_diff_max", "{:.2g}"),
    "obs_in_loss": ("observation tokens in loss", "loss/observation_tokens_in_loss", "{:.0f}"),
    "mask_outside": ("mask 1 outside generated", OUTSIDE, "{:.0f}"),
    "wall_s": ("wall s", "timing_s/step", "{:.1f}"),
}
# Executed search calls (scripted and model-written) and the tool-response tokens the mask check looked at.
ALL_CALLS = "search/calls"
OBSERVATION_TOKENS = "loss/observation_tokens"
# verl's FAQ: a mean rollout/actor probability difference above 0.01 is a precision or sync bug, above 0.005 a
# warning. On a healthy bf16 GPU run with raw log-probs at T 1 the mean is kernel noise between vLLM and the FSDP2
# actor, ESTIMATED 0.003-0.008 a step (verl-project/verl#7749 reports ~0.0064 averaged), so a single step can cross
# either limit: `ProbDiffWatch` (below) stops a GPU run only on PROB_DIFF_MEAN_STREAK steps in a row at or over
# PROB_DIFF_MEAN_FAIL, or one step at PROB_DIFF_MEAN_CEILING, and warns relative to the run's own first steps. The
# exact weight fingerprint at every sync (trainer/weight_sync/), not this mean, is what guarantees the sync. The CPU
# runs compute in fp32 everywhere and hold the max to SYNC_MAX_PROB_DIFF: measured (docs/cpu-proofs.md) against a
# synced rollout and a deliberately stale one.
SYNC_MAX_PROB_DIFF = 1e-4
PROB_DIFF_MEAN_FAIL = 0.01  # verl FAQ: a precision or sync bug
PROB_DIFF_MEAN_WARN = 0.005  # verl FAQ: healthy below
PROB_DIFF_MEAN_STREAK = 3  # consecutive steps at or over PROB_DIFF_MEAN_FAIL that stop a GPU run
# One step at or over this stops at once: ~6x the top of the noise estimate above, ~8x verl#7749's average, so no
# healthy step reaches it; a rollout on other weights or in another dtype family does (an ESTIMATE: the bench in
# docs/training.md measured 0.0129-0.0145 for top-p-processed log-probs, the bug the streak catches instead).
PROB_DIFF_MEAN_CEILING = 0.05
PROB_DIFF_MEAN_BASELINE_STEPS = 3  # the run's own first steps, whose median later steps are compared with
PROB_DIFF_MEAN_DRIFT = 1.5  # a warning: a step this many times the run's own baseline (and in verl's band)
PROB_DIFF_MEAN = "training/rollout_probs_diff_mean"
ENTROPY = "actor/entropy"  # verl's per-step mean entropy of the policy over the trained tokens
STALENESS_WORST_MAX = "training/off_policy/trajectory_staleness_worst/max"  # verl's, async modes only
UPDATE_WEIGHTS_S = "timing_s/update_weights"  # verl times the weight push each step in separate_async
# The line a matched sync prints, and its reader, live beside the printers (trainer/weight_sync/match_line.py);
# imported here under their old names.


@dataclass(frozen=True)
class StepRow:
    """One training step as verl logged it, and which invocation ran it."""

    step: int
    run: str
    metrics: dict[str, float]

    def get(self, column: str) -> float:
        return self.metrics.get(COLUMNS[column][1], math.nan)

    def figures(self) -> dict[str, float | int | str]:
        """The row under the step table's column names (COLUMNS), as a run's record holds it; NaN where verl
        logged no such figure."""
        return {"step": self.step, "run": self.run, **{key: self.get(key) for key in COLUMNS}}


def _number(text: str) -> float:
    found = _NUMBER.search(text.replace("np.float64(", "").replace("np.int64(", ""))
    return float(found.group(0)) if found else math.nan


def parse_steps(log_text: str, run: str) -> list[StepRow]:
    """Every `step:N - ...` line of a verl console log, as rows."""
    rows = []
    for line in log_text.splitlines():
        match = STEP_LINE.search(line)
        if not match:
            continue
        metrics = {}
        for part in match.group(2).split(" - "):
            key, sep, value = part.partition(":")
            if sep:
                metrics[key.strip()] = _number(value)
        rows.append(StepRow(step=int(match.group(1)), run=run, metrics=metrics))
    return rows


# A per-step check: the problems of one step as verl logs it (empty: fine); the CPU runs stop at the first.
StepCheck = Callable[[StepRow], list[str]]
# the short line a CPU run prints per step as it arrives
_SUMMARY = ("reward", "response_length", "grad_norm", "sync_diff", "obs_in_loss", "wall_s")


def step_summary(row: StepRow) -> str:
    """`step N (run): mean reward 0.41, response length 180.2, ...`: what a CPU run shows as each step ends."""
    cells = [f"{COLUMNS[name][0]} {COLUMNS[name][2].format(row.get(name))}" for name in _SUMMARY]
    return f"step {row.step} ({row.run}): " + ", ".join(cells)


def step_table(rows: Iterable[StepRow]) -> str:
    """A Markdown table, one row a step."""
    headers = ["step", "run", *(header for header, _, _ in COLUMNS.values())]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [str(row.step), row.run]
        cells += [fmt.format(row.get(name)) for name, (_, _, fmt) in COLUMNS.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_steps(
    rows: Sequence[StepRow],
    steps: int,
    max_prob_diff: float = SYNC_MAX_PROB_DIFF,
    *,
    searching: bool = True,
) -> list[str]:
    """What the rows miss of a real run (empty: nothing): every step once, searching, no failures, finite.

    `max_prob_diff` is the fp32 runs' sync bound; a bf16 run passes inf and adds `gpu_step_problems`' mean bound.
    `searching=False`: a run whose trajectories end before any tool runs (`make learn-cpu-real --stage query`,
    where the reward runs the model's query) is not asked for a search call.
    """
    problems = []
    seen = [row.step for row in rows]
    if seen != list(range(1, steps + 1)):
        problems.append(f"steps logged {seen}, expected 1..{steps} once each")
    for row in rows:
        missing = [key for _, key, _ in COLUMNS.values() if key not in row.metrics]
        if missing:
            problems.append(f"step {row.step}: verl logged no {', '.join(missing)}")
            continue
        if not row.get("trajectories") > 0:
            problems.append(f"step {row.step}: no trajectories")
        calls = row.metrics.get(ALL_CALLS, math.nan)
        if searching and not calls > 0:
            problems.append(f"step {row.step}: no search call")
        problems += sync_and_mask_problems(row, max_prob_diff)
        failed = service_failures(row)
        if failed != 0:
            problems.append(f"step {row.step}: {failed:.0f} failed searches")
        for name in ("reward", "policy_loss", "grad_norm", "response_length"):
            if not math.isfinite(row.get(name)):
                problems.append(f"step {row.step}: {COLUMNS[name][0]} is {row.get(name)}")
    return problems


def service_failures(row: StepRow) -> float:
    """The step's failed searches less those its policy caused (searchrl.prompt.POLICY_FAILURES: a call whose
    arguments are not a query list, an empty query): a run is broken by the service failing, not by a model that
    wrote a bad call (run 10 of make learn-search stopped on one such call at step 7 of 8, before its eval)."""
    from searchrl.prompt import POLICY_FAILURES

    policy = sum(row.metrics.get(f"{COLUMNS['search_failures'][1]}/{kind}", 0.0) for kind in POLICY_FAILURES)
    return row.get("search_failures") - policy


def sync_and_mask_problems(row: StepRow, max_prob_diff: float = SYNC_MAX_PROB_DIFF) -> list[str]:
    """The weight-sync and loss-mask checks of one step (module docstring), each problem one phrase."""
    problems = []
    diff = row.get("sync_diff")
    if not diff <= max_prob_diff:  # NaN fails too: verl found no trained token to compare
        problems.append(
            f"step {row.step}: sync max prob diff {diff:.2g} above {max_prob_diff:.0e} "
            "(the rollout did not sample from the weights the trainer holds)"
        )
    return problems + mask_problems(row)


def async_step_problems(
    row: StepRow, threshold: int | None = None, *, weight_push: bool = False
) -> list[str]:
    """One step of an async run: the sync bound only where no trajectory is stale, the loss-mask checks, and the
    version metrics (module docstring); a metric verl or the sampler did not log is a problem. `weight_push`
    (separate_async): verl timed a push of the weights to the rollout replicas on this step too."""
    worst = row.metrics.get(STALENESS_WORST_MAX, math.nan)
    problems = [] if not math.isnan(worst) else [_missing(row, STALENESS_WORST_MAX, "staleness")]
    problems += sync_and_mask_problems(row, SYNC_MAX_PROB_DIFF if worst == 0 else math.inf)
    for key in (versions.MISSING, versions.STALENESS_WORST_MAX, versions.VERIFIED):
        if math.isnan(row.metrics.get(key, math.nan)):
            problems.append(_missing(row, key, "the weights versions"))
    if row.metrics.get(versions.MISSING, 0) > 0:
        problems.append(
            f"step {row.step}: {row.metrics[versions.MISSING]:.0f} trajectories carry no weights version"
        )
    if threshold is not None and row.metrics.get(versions.STALENESS_WORST_MAX, 0) > threshold - 1:
        problems.append(
            f"step {row.step}: worst staleness {row.metrics[versions.STALENESS_WORST_MAX]:.0f} above "
            f"{threshold - 1} (max_off_policy_threshold {threshold})"
        )
    if weight_push and not row.metrics.get(UPDATE_WEIGHTS_S, math.nan) >= 0:
        problems.append(_missing(row, UPDATE_WEIGHTS_S, "the weight push to the rollout replicas"))
    return problems


def _missing(row: StepRow, key: str, why: str) -> str:
    return f"step {row.step}: verl logged no {key}, so {why} is unchecked"


# the mask invariant's counts (trainer/plugins/generated_spans.py), each with what a non-zero count means
_INVARIANT = (
    (OUTSIDE, "loss-mask tokens outside what the rollout server generated (environment text is trained on)"),
    (MISSING, "generated tokens with loss mask 0 (the policy's own samples are left out of the loss)"),
    (
        UNRECORDED,
        "trajectories without the agent loop's record of generated tokens, so their mask is unchecked "
        "(rollout.agent.default_agent_loop must be searchrl_tool_agent, or on CPU its subclass "
        "searchrl_scripted_tool_agent)",
    ),
)


def invariant_problems(row: StepRow) -> list[str]:
    """The mask invariant of one step: mask 1 exactly on the server-generated tokens; a missing count fails."""
    problems = []
    for key, meaning in _INVARIANT:
        value = row.metrics.get(key, math.nan)
        if math.isnan(value):
            problems.append(_missing(row, key, "the mask invariant"))
        elif value != 0:
            problems.append(f"step {row.step}: {value:.0f} {meaning}")
    return problems


def mask_problems(row: StepRow) -> list[str]:
    """The loss-mask checks of one step, on every engine: no tool-response token in the loss, and some tool-response
    token seen wherever the step searched (else a template that never writes `<tool_response>` passes vacuously);
    then the invariant from the agent loop's record (`invariant_problems`). A missing metric is a problem, never
    a pass: the check that would have caught the bug did not run."""
    in_loss = row.metrics.get(COLUMNS["obs_in_loss"][1], math.nan)
    calls = row.metrics.get(ALL_CALLS, math.nan)
    seen = row.metrics.get(OBSERVATION_TOKENS, math.nan)
    if math.isnan(in_loss):
        return [_missing(row, COLUMNS["obs_in_loss"][1], "the loss mask"), *invariant_problems(row)]
    problems = []
    if in_loss != 0:
        problems.append(
            f"step {row.step}: observation tokens in loss {in_loss:.0f} (tool responses are trained on)"
        )
    if math.isnan(calls) or math.isnan(seen):
        problems.append(
            _missing(row, ALL_CALLS if math.isnan(calls) else OBSERVATION_TOKENS, "the loss mask")
        )
    elif calls > 0 and not seen > 0:
        problems.append(
            f"step {row.step}: searched but no tool-response token was found to check the mask on"
        )
    return problems + invariant_problems(row)


@dataclass(frozen=True)
class Checks:
    """What a run's checks read (`checks_made`): the figures of its checks line, and of its run record
    (trainer/proofs/record.py), so a test reads numbers, not the line's prose."""

    syncs: int  # syncs whose fingerprint matched
    sync_diff: float  # the largest rollout/trainer difference over the steps the bound covered
    covered: int  # steps the sync bound covered
    steps: int
    observation_tokens_in_loss: float
    observation_tokens_seen: float
    mask_outside: float  # mask tokens outside the generated spans
    mask_missing: float  # generated tokens unmasked
    unrecorded: float  # trajectories unrecorded
    async_mode: bool = False
    mean_bound: bool = False

    def line(self) -> str:
        scope = (
            f"{self.covered} steps"
            if not self.async_mode
            else f"{self.covered} of {self.steps} steps (staleness 0)"
        )
        figure = "sync mean prob diff (bf16) up to" if self.mean_bound else "sync max prob diff"
        return (
            f"checks: {self.syncs} syncs fingerprinted, all matched; {figure} {self.sync_diff:.2g} over {scope}; "
            f"{self.observation_tokens_in_loss:.0f} observation tokens in the loss "
            f"({self.observation_tokens_seen:.0f} seen); {self.mask_outside:.0f} mask tokens outside the generated "
            f"spans, {self.mask_missing:.0f} generated tokens unmasked, {self.unrecorded:.0f} trajectories "
            "unrecorded"
        )


def checks_line(rows: Sequence[StepRow], logs: Sequence[str], **kwargs: Any) -> str:
    """The one line a passing run ends with: `checks_made(rows, logs, **kwargs)`'s figures."""
    return checks_made(rows, logs, **kwargs).line()


def checks_made(
    rows: Sequence[StepRow],
    logs: Sequence[str],
    *,
    async_mode: bool = False,
    mean_bound: bool = False,
    error: type[SearchRLError] = StepCheckError,
) -> Checks:
    """What a passing run's checks read; `error` (one line naming the check) when a check never ran, so a run
    cannot pass on zeros.

    `rows`: every step of the run (all its invocations, seeds or pilots); `logs`: their logs (or just their
    SYNC_MATCH_LINE lines). `async_mode`: the sync bound covers only steps whose worst staleness is 0
    (async_step_problems). `mean_bound`: a bf16 run, whose sync figure is verl's mean difference (ProbDiffWatch),
    not the fp32 runs' max. Figures: the syncs whose fingerprint matched; the largest difference over the steps the
    bound covered, and how many; the observation tokens in the loss and seen; the mask invariant's three counts.
    """

    def never_ran(what: str) -> SearchRLError:
        return error(f"checks: {what}")

    if not rows:
        raise never_ran("no training step was logged, so no check ran")
    syncs = sync_matches(logs)
    if not syncs:
        raise never_ran(
            "the weight-sync fingerprint check never ran: no 'searchrl-weight-sync: ... fingerprint matched' line "
            "in the run's logs (the rollout adapter did not compare what the rollout holds)"
        )
    for row in rows:
        for key, what in (
            (COLUMNS["obs_in_loss"][1], "the loss mask"),
            (OBSERVATION_TOKENS, "the loss mask"),
            (ALL_CALLS, "the loss mask"),
            *((key, "the mask invariant") for key, _ in _INVARIANT),
            *([(STALENESS_WORST_MAX, "the sync bound's scope")] if async_mode else []),
        ):
            if math.isnan(row.metrics.get(key, math.nan)):
                raise never_ran(_missing(row, key, what))
    covered = [row for row in rows if not async_mode or row.metrics[STALENESS_WORST_MAX] == 0]
    if not covered:
        raise never_ran(
            f"the sync bound covered no step: none of the {len(rows)} steps has worst staleness 0 "
            f"({STALENESS_WORST_MAX})"
        )
    key = PROB_DIFF_MEAN if mean_bound else COLUMNS["sync_diff"][1]
    for row in covered:
        if math.isnan(row.metrics.get(key, math.nan)):
            raise never_ran(_missing(row, key, "the weight sync"))
    diff = max(row.metrics[key] for row in covered)

    def total(key: str) -> float:
        return sum(row.metrics[key] for row in rows)

    seen, calls = total(OBSERVATION_TOKENS), total(ALL_CALLS)
    if calls > 0 and not seen > 0:
        raise never_ran(
            f"the loss-mask check saw no tool-response token although the run made {calls:.0f} search calls"
        )
    return Checks(
        syncs=len(syncs),
        sync_diff=diff,
        covered=len(covered),
        steps=len(rows),
        observation_tokens_in_loss=total(COLUMNS["obs_in_loss"][1]),
        observation_tokens_seen=seen,
        mask_outside=total(OUTSIDE),
        mask_missing=total(MISSING),
        unrecorded=total(UNRECORDED),
        async_mode=async_mode,
        mean_bound=mean_bound,
    )


@dataclass
class ProbDiffWatch:
    """verl's mean rollout/actor probability difference over one GPU run, a signal a healthy run cannot trip.

    The mean is bf16 kernel noise on a healthy run (see PROB_DIFF_MEAN_FAIL's comment) and may cross verl's FAQ
    limits on any single step, so a step stops the run only when it is the PROB_DIFF_MEAN_STREAK-th in a row at or
    over PROB_DIFF_MEAN_FAIL (a precision bug is systematic: an fp16 or processed-log-prob rollout is off on every
    step) or reaches PROB_DIFF_MEAN_CEILING (no healthy step comes near). A single step over the bound is a warning
    that counts the streak. The median of the run's first PROB_DIFF_MEAN_BASELINE_STEPS steps is its baseline: a
    baseline in verl's band [0.005, 0.01) is said once (expected for bf16), and from then on a warning means a step
    at least PROB_DIFF_MEAN_DRIFT times its own baseline, and in the band: a rise worth reading, not every step.
    `seed` takes the steps of earlier invocations of the same run (a resume), so the baseline stays the run's first
    steps and a streak carries across the restart."""

    values: list[tuple[int, float]] = field(default_factory=list)
    streak: int = 0

    @property
    def baseline(self) -> float | None:
        """The median of the run's first PROB_DIFF_MEAN_BASELINE_STEPS steps; None before it has them."""
        first = [value for _, value in self.values[:PROB_DIFF_MEAN_BASELINE_STEPS]]
        return statistics.median(first) if len(first) == PROB_DIFF_MEAN_BASELINE_STEPS else None

    def seed(self, rows: Iterable[StepRow]) -> None:
        """Take earlier invocations' steps without judging them again (they were judged as they ran)."""
        for row in rows:
            self.observe(row)

    def observe(self, row: StepRow) -> tuple[list[str], list[str]]:
        """(failures, warnings) of one step's mean; a mean verl did not log is a failure (the check did not run)."""
        mean = row.metrics.get(PROB_DIFF_MEAN, math.nan)
        if math.isnan(mean):
            return [
                _missing(row, PROB_DIFF_MEAN, "the weight sync")
                + " (actor_rollout_ref.rollout.calculate_log_probs must stay True)"
            ], []
        had_baseline = self.baseline is not None
        self.values.append((row.step, mean))
        self.streak = self.streak + 1 if mean >= PROB_DIFF_MEAN_FAIL else 0
        why = "verl's FAQ: a precision or weight-sync bug; check the rollout dtype and that weights reach the engine"
        if mean >= PROB_DIFF_MEAN_CEILING:
            return [
                f"step {row.step}: rollout/actor mean prob diff {mean:.3g} >= {PROB_DIFF_MEAN_CEILING} on one step "
                f"(far above bf16 noise; {why})"
            ], []
        if self.streak >= PROB_DIFF_MEAN_STREAK:
            steps = [step for step, _ in self.values[-self.streak :]]
            return [
                f"step {row.step}: rollout/actor mean prob diff {mean:.3g} >= {PROB_DIFF_MEAN_FAIL} on "
                f"{self.streak} steps in a row ({steps[0]}-{steps[-1]}; {why})"
            ], []
        if self.streak:
            return [], [
                f"step {row.step}: rollout/actor mean prob diff {mean:.3g} >= {PROB_DIFF_MEAN_FAIL} "
                f"({self.streak} of {PROB_DIFF_MEAN_STREAK} steps in a row stop the run)"
            ]
        baseline = self.baseline
        if baseline is None:
            return [], []
        if not had_baseline:
            if baseline < PROB_DIFF_MEAN_WARN:
                return [], []
            return [], [
                f"step {row.step}: rollout/actor mean prob diff baseline {baseline:.3g} (median of steps "
                f"1-{PROB_DIFF_MEAN_BASELINE_STEPS}) is in verl's warning band [{PROB_DIFF_MEAN_WARN}, "
                f"{PROB_DIFF_MEAN_FAIL}): expected of a bf16 rollout with raw log-probs (estimated 0.003-0.008); "
                f"from here a warning means {PROB_DIFF_MEAN_DRIFT}x this baseline"
            ]
        if mean >= PROB_DIFF_MEAN_WARN and mean >= PROB_DIFF_MEAN_DRIFT * baseline:
            return [], [
                f"step {row.step}: rollout/actor mean prob diff {mean:.3g} >= {PROB_DIFF_MEAN_WARN} and "
                f"{mean / baseline:.1f}x the run's own baseline {baseline:.3g}"
            ]
        return [], []

    def summary(self) -> str:
        """One line on the mean over the run: what the rehearsal and every GPU run report at their end."""
        if not self.values:
            return "rollout/actor mean prob diff: no step logged it"
        values = [value for _, value in self.values]
        top_step, top = max(self.values, key=lambda pair: pair[1])
        baseline = self.baseline
        return (
            f"rollout/actor mean prob diff over {len(values)} steps: median {statistics.median(values):.3g}, "
            f"max {top:.3g} at step {top_step}, steps at or over {PROB_DIFF_MEAN_FAIL}: "
            f"{sum(value >= PROB_DIFF_MEAN_FAIL for value in values)}"
            + (f"; baseline {baseline:.3g}" if baseline is not None else "")
        )


def gpu_step_problems(row: StepRow, watch: ProbDiffWatch | None = None) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one GPU step. bf16 rollouts differ from the trainer by more than fp32 noise, so the
    CPU runs' max bound does not apply: the run's `watch` judges the mean rollout/actor probability difference
    (`ProbDiffWatch`: a streak over verl's FAQ limit, or one step at the ceiling; without a watch the step is judged
    alone, as the first of a run). The loss-mask checks are the CPU runs' own and fail the step; a metric verl did
    not log fails it too."""
    failures, warnings = (watch or ProbDiffWatch()).observe(row)
    return failures + mask_problems(row), warnings


__all__ = [
    "service_failures",
    "ALL_CALLS",
    "STALENESS_WORST_MAX",
    "SYNC_MATCH_LINE",
    "SYNC_MATCH_PATTERN",
    "Checks",
    "checks_line",
    "checks_made",
    "sync_match_line",
    "sync_matches",
    "async_step_problems",
    "ENTROPY",
    "PROB_DIFF_MEAN",
    "PROB_DIFF_MEAN_CEILING",
    "PROB_DIFF_MEAN_FAIL",
    "PROB_DIFF_MEAN_STREAK",
    "PROB_DIFF_MEAN_WARN",
    "ProbDiffWatch",
    "gpu_step_problems",
    "invariant_problems",
    "mask_problems",
    "COLUMNS",
    "SYNC_MAX_PROB_DIFF",
    "StepCheck",
    "StepRow",
    "check_steps",
    "STEP_LINE",
    "parse_steps",
    "step_summary",
    "step_table",
    "sync_and_mask_problems",
]
