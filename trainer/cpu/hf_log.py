"""The lines the `hf` rollout engine (trainer/cpu/hf_rollout.py) prints into a run's log, and their readers.

The engine prints them in its Ray actor; the readers run in the CLI process (the CPU proofs' harness and checks)
and must not import the engine (torch, transformers, verl's rollout classes), so each format is defined here,
beside the pattern that reads it back.
"""

from __future__ import annotations

import re

# One line per weight update, in the run's log (Ray forwards the hf rollout actor's stdout): the CPU runs count them.
UPDATE_LINE = "searchrl-hf-rollout: weight update {n} for step {step}: {tensors} tensors, fingerprint {fingerprint}{note}"
UPDATE_PATTERN = r"searchrl-hf-rollout: weight update (\d+) for step (-?\d+)"
# One line per generate batch: how well the turns batched, and the model's own tokens/s (the CPU runs sum them).
BATCH_LINE = "searchrl-hf-rollout: batch of {n} sequences, {tokens} new tokens in {seconds:.2f} s"
BATCH_PATTERN = r"searchrl-hf-rollout: batch of (\d+) sequences, (\d+) new tokens in ([\d.]+) s"
# The phase the engine's first update marks in verl's start-up (trainer/verl_progress.py StartupProgress
# `extra_phases`, with BATCH_PATTERN as its `batch_pattern`)
PHASES = [(UPDATE_PATTERN.replace(r"(\d+)", "(1)", 1), "rollout server holds the weights (update 1)")]

# the update line with its fingerprint (UPDATE_LINE): number, step, digest
_UPDATE_DIGEST = re.compile(UPDATE_PATTERN + r": \d+ tensors, fingerprint (\S+)")


def update_digests(log_text: str) -> list[tuple[int, int, str]]:
    """(update number, step, fingerprint digest) of each hf-engine weight update in a log, in order: what the CPU
    runs compare with the trainer's matched syncs and across a resume."""
    return [(int(n), int(step), digest) for n, step, digest in _UPDATE_DIGEST.findall(log_text)]


__all__ = ["BATCH_LINE", "BATCH_PATTERN", "PHASES", "UPDATE_LINE", "UPDATE_PATTERN", "update_digests"]
