"""verl's start-up phases, one line each (trainer/verl_progress.py), and an engine's own lines passed in."""

from __future__ import annotations

from searchrl.trainer.cpu import hf_log
from searchrl.trainer.verl_progress import StartupProgress

UPDATE = hf_log.UPDATE_LINE.format(n=1, step=0, tensors=27, fingerprint="ab12", note="")
SLOW = hf_log.BATCH_LINE.format(n=8, tokens=1536, seconds=42.5)


def _clock() -> float:
    return 100.0


def test_verls_phases_are_shown_once_and_an_engines_lines_only_when_passed_in():
    """The reader names no engine: without the hf engine's markers its lines are not phases; with them the first
    update and a slow batch get a line, as the CPU harness passes them (trainer/proofs/harness.py)."""
    plain = StartupProgress(clock=_clock)
    assert plain.line("INFO Started a local Ray instance.") == "verl +0 s: Ray started"
    assert plain.line("INFO Started a local Ray instance.") is None
    assert plain.line(UPDATE) is None and plain.line(SLOW) is None

    hf = StartupProgress(clock=_clock, extra_phases=hf_log.PHASES, batch_pattern=hf_log.BATCH_PATTERN)
    assert (
        hf.line("(HFGenerateServer pid=1) " + UPDATE)
        == "verl +0 s: rollout server holds the weights (update 1)"
    )
    assert hf.line(SLOW) == "verl +0 s: rollout batch: 8 sequences, 1536 new tokens in 42 s (36.1 tokens/s)"
    assert hf.line(hf_log.BATCH_LINE.format(n=8, tokens=100, seconds=1.0)) is None
