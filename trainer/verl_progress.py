"""One short line per phase of verl's start-up, and per slow rollout batch, picked out of its console output.

Before its first step line verl spends from half a minute (the tiny model) to minutes (real weights on 2 cores:
`make train-cpu-real` printed nothing for 6 minutes, issue 39) starting Ray, reading the data, building the
actor and reference model and the rollout server; its own output for that is ~1,000 lines of config dump and
warnings, which the CPU runs send to the log only. `StartupProgress` turns the few lines that mark a phase into
one line each, with the seconds since the launch, so a reader sees where the run is. A step of a real model can
itself take minutes; a rollout batch that took `slow_batch_s` or more gets its own line too.

The markers are verl 0.9.1's (`trainer/ppo/v1/trainer_base.py`, `utils/model.py`, Ray's start-up line); a marker a
later verl drops only makes the run quieter, never wrong. A run whose rollout engine prints lines of its own passes
their markers in (`extra_phases`, and `batch_pattern` for its per-batch line): the CPU runs pass the hf engine's
(trainer/cpu/hf_log.py), so this reader, which runs in the CLI process of any run, names no engine.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# (marker, what the line says); a marker's groups fill the text's {1}, {2}, ...
PHASES: list[tuple[str, str]] = [
    (r"Started a local Ray instance", "Ray started"),
    (
        r"train dataset size: (\d+), val dataset size: (\d+)",
        "data read: {1} training rows, {2} validation rows",
    ),
    (r"(\w+ForCausalLM) contains ([\d.]+\s?[KMB]?) parameters", "model built: {1}, {2} parameters"),
    (r"actor and ref model engine initialized", "actor and reference model loaded"),
    (r"Resuming from (\S+), setting global step", "resuming from {1}"),
    (r"all initialize finished, ready to fit", "workers ready, first rollout starting"),
]


class StartupProgress:
    """Feed it verl's output line by line; it returns the line to show, or None (each phase shown once).

    `extra_phases`: the engine's own (marker, what the line says) pairs, after verl's. `batch_pattern`: the engine's
    line per generate batch, its groups the sequences, new tokens and seconds; a batch of `slow_batch_s` or more is
    shown."""

    def __init__(
        self,
        slow_batch_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        extra_phases: Sequence[tuple[str, str]] = (),
        batch_pattern: str | None = None,
    ) -> None:
        self.clock = clock
        self.started = clock()
        self.slow_batch_s = slow_batch_s
        self.phases = [*PHASES, *extra_phases]
        self.batch = re.compile(batch_pattern) if batch_pattern else None
        self.seen: set[str] = set()

    def line(self, text: str) -> str | None:
        text = _ANSI.sub("", text)
        batch = self.batch.search(text) if self.batch else None
        if batch:
            n, tokens, seconds = int(batch.group(1)), int(batch.group(2)), float(batch.group(3))
            if seconds < self.slow_batch_s:
                return None
            return self._stamp(
                f"rollout batch: {n} sequences, {tokens} new tokens in {seconds:.0f} s "
                f"({tokens / seconds:.1f} tokens/s)"
            )
        for marker, says in self.phases:
            match = re.search(marker, text)
            if match and says not in self.seen:
                self.seen.add(says)
                return self._stamp(says.format(None, *match.groups()))
        return None

    def _stamp(self, says: str) -> str:
        return f"verl +{self.clock() - self.started:.0f} s: {says}"


__all__ = ["PHASES", "StartupProgress"]
