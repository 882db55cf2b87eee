"""The lines the `hf` rollout engine (trainer/cpu/hf_rollout.py) prints into a run's log, and their readers.

The engine prints them in its Ray actor; the readers run in the CLI process (the CPU proofs' harness and checks)
and must not import the engine (torch, transformers, verl's rollout classes), so each format is defined here,
beside the pattern that reads it back.
"""

from __future__ import annotations

import re

from searchrl.trainer.verl_progress import UPDATE_PATTERN

# the update line with its fingerprint (UPDATE_LINE): number, step, digest
_UPDATE_DIGEST = re.compile(UPDATE_PATTERN + r": \d+ tensors, fingerprint (\S+)")


def update_digests(log_text: str) -> list[tuple[int, int, str]]:
    """(update number, step, fingerprint digest) of each hf-engine weight update in a log, in order: what the CPU
    runs compare with the trainer's matched syncs and across a resume."""
    return [(int(n), int(step), digest) for n, step, digest in _UPDATE_DIGEST.findall(log_text)]


__all__ = ["update_digests"]
