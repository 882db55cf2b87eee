"""The step table of a training run, read from verl's console metrics, and the checks `make train-cpu` makes.

verl's console logger prints one line per step, `step:N - key:value - key:value ...` (verl/utils/tracking.py),
which Ray prefixes with the actor's name. Reading that line, not a file of our own, means the table shows what a
GPU run's console (and W&B) shows, `search/*` included (trainer/sampler.py adds those).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)

# column: (header, verl metric key, format)
COLUMNS = {
    "trajectories": ("trajectories", "search/trajectories", "{:.0f}"),
    "search_calls": ("search calls", "search/calls", "{:.0f}"),
    "search_failures": ("failed searches", "search/failures", "{:.0f}"),
    "reward": ("mean reward", "critic/score/mean", "{:.3f}"),
    "response_length": ("response length", "response_length/mean", "{:.1f}"),
    "policy_loss": ("policy loss", "actor/pg_loss", "{:.4g}"),
    "grad_norm": ("grad norm", "actor/grad_norm", "{:.3g}"),
    "wall_s": ("wall s", "timing_s/step", "{:.1f}"),
}


@dataclass(frozen=True)
class StepRow:
    """One training step as verl logged it, and which invocation ran it."""

    step: int
    run: str
    metrics: dict[str, float]

    def get(self, column: str) -> float:
        return self.metrics.get(COLUMNS[column][1], math.nan)


def _number(text: str) -> float:
    found = _NUMBER.search(text.replace("np.float64(", "").replace("np.int64(", ""))
    return float(found.group(0)) if found else math.nan


def parse_steps(log_text: str, run: str) -> list[StepRow]:
    """Every `step:N - ...` line of a verl console log, as rows."""
    rows = []
    for line in log_text.splitlines():
        match = _STEP_LINE.search(line)
        if not match:
            continue
        metrics = {}
        for part in match.group(2).split(" - "):
            key, sep, value = part.partition(":")
            if sep:
                metrics[key.strip()] = _number(value)
        rows.append(StepRow(step=int(match.group(1)), run=run, metrics=metrics))
    return rows


def step_table(rows: Iterable[StepRow]) -> str:
    """A Markdown table, one row a step."""
    headers = ["step", "run", *(header for header, _, _ in COLUMNS.values())]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [str(row.step), row.run]
        cells += [fmt.format(row.get(name)) for name, (_, _, fmt) in COLUMNS.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_steps(rows: Sequence[StepRow], steps: int) -> list[str]:
    """What the rows miss of a real run (empty: nothing): every step once, searching, no failures, finite."""
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
        if not row.get("search_calls") > 0:
            problems.append(f"step {row.step}: no search call")
        if row.get("search_failures") != 0:
            problems.append(f"step {row.step}: {row.get('search_failures'):.0f} failed searches")
        for name in ("reward", "policy_loss", "grad_norm", "response_length"):
            if not math.isfinite(row.get(name)):
                problems.append(f"step {row.step}: {COLUMNS[name][0]} is {row.get(name)}")
    return problems


__all__ = ["COLUMNS", "StepRow", "check_steps", "parse_steps", "step_table"]
