"""The line a matched weight sync prints, and its reader: one format for the printer and the counter.

The rank that compared a sync's fingerprint and found it equal prints it (trainer/weight_sync/tap.py for vLLM and
sglang, trainer/cpu/hf_rollout.py for the hf engine); Ray forwards it to the run's log, where
`step_checks.checks_line` counts them. Here, beside the printers, so that weight_sync/ imports nothing from the CLI
room (tests/trainer/test_rooms.py); stdlib only, so the CLI reads it without torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A mismatch prints nothing here: it raises StepCheckError (fingerprint.check_sync). `step` is the step that samples
# from the weights (verl's global_steps + 1, as a failed check names it), `digest` the fingerprint's
# (fingerprint.digest).
SYNC_MATCH_LINE = (
    "searchrl-weight-sync: step {step} sync fingerprint matched: {tensors} tensors, digest {digest}"
)
SYNC_MATCH_PATTERN = r"searchrl-weight-sync: step (\d+) sync fingerprint matched: (\d+) tensors, digest (\w+)"


def sync_match_line(global_steps: int | None, tensors: int, digest: str) -> str:
    """The SYNC_MATCH_LINE of a sync verl passed `global_steps` with (the step just trained, 0 before step 1)."""
    return SYNC_MATCH_LINE.format(step=int(global_steps or 0) + 1, tensors=tensors, digest=digest)


def sync_matches(logs: Iterable[str]) -> list[tuple[int, int, str]]:
    """(step, tensors, digest) of every matched weight-sync fingerprint (SYNC_MATCH_LINE) in the logs, in order."""
    return [
        (int(step), int(tensors), digest)
        for text in logs
        for step, tensors, digest in re.findall(SYNC_MATCH_PATTERN, text)
    ]


__all__ = ["SYNC_MATCH_LINE", "SYNC_MATCH_PATTERN", "sync_match_line", "sync_matches"]
