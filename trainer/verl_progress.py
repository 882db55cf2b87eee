"""One short line per phase of verl's start-up, and per slow rollout batch, picked out of its console output.

Before its first step line verl spends from half a minute (the tiny model) to minutes (real weights on 2 cores:
`make train-cpu-real` printed nothing for 6 minutes, issue 39) starting Ray, reading the data, building the
actor and reference model and the rollout server; its own output for that is ~1,000 lines of config dump and
warnings, which the CPU runs send to the log only. `StartupProgress` turns the few lines that mark a phase into
one line each, with the seconds since the launch, so a reader sees where the run is. A step of a real model can
itself take minutes; a rollout batch that took `slow_batch_s` or more gets its own line too.

The markers are verl 0.9.1's (`trainer/ppo/v1/trainer_base.py`, `utils/model.py`, Ray's start-up line) and our hf rollout's
(trainer/cpu/hf_rollout.py); a marker a later verl drops only makes the run quieter, never wrong. The hf rollout's
lines are defined here, the format it prints beside the pattern that reads it back, because the readers (this
module, trainer/step_checks.py and the CPU proofs) run in the CLI process and must not import the CPU engine.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

# One line per weight update, in the run's log (Ray forwards the hf rollout actor's stdout): the CPU runs count them.
UPDATE_LINE = "searchrl-hf-rollout: weight update {n} for step {step}: {tensors} tensors, fingerprint {fingerprint}{note}"
UPDATE_PATTERN = r"searchrl-hf-rollout: weight update (\d+) for step (-?\d+)"
# One line per generate batch: how well the turns batched, and the model's own tokens/s (the CPU runs sum them).
BATCH_LINE = "searchrl-hf-rollout: batch of {n} sequences, {tokens} new tokens in {seconds:.2f} s"
BATCH_PATTERN = r"searchrl-hf-rollout: batch of (\d+) sequences, (\d+) new tokens in ([\d.]+) s"

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
    (UPDATE_PATTERN.replace(r"(\d+)", "(1)", 1), "rollout server holds the weights (update 1)"),
]


class StartupProgress:
    """Feed it verl's output line by line; it returns the line to show, or None (each phase shown once)."""

    def __init__(self, slow_batch_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.slow_batch_s = slow_batch_s
        self.seen: set[str] = set()

    def line(self, text: str) -> str | None:
        text = _ANSI.sub("", text)
        batch = re.search(BATCH_PATTERN, text)
        if batch:
            n, tokens, seconds = int(batch.group(1)), int(batch.group(2)), float(batch.group(3))
            if seconds < self.slow_batch_s:
                return None
            return self._stamp(
                f"rollout batch: {n} sequences, {tokens} new tokens in {seconds:.0f} s "
                f"({tokens / seconds:.1f} tokens/s)"
            )
        for marker, says in PHASES:
            match = re.search(marker, text)
            if match and says not in self.seen:
                self.seen.add(says)
                return self._stamp(says.format(None, *match.groups()))
        return None

    def _stamp(self, says: str) -> str:
        return f"verl +{self.clock() - self.started:.0f} s: {says}"


__all__ = ["BATCH_LINE", "BATCH_PATTERN", "PHASES", "UPDATE_LINE", "UPDATE_PATTERN", "StartupProgress"]
