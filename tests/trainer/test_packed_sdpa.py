"""Packed micro batches are correct under sdpa: verl 0.9.1's own FSDP engine on the tiny Qwen2, fp32, CPU/gloo.

verl's remove-padding path (use_remove_padding=True, what FLASH_ATTN=1 runs and what a packed sdpa run would run)
and its padded path (FLASH_ATTN=0) must give the same per-token log-probs, entropy and gradients for samples of
different lengths; controls where samples can see each other must fail the same comparison, so the comparison
can tell. The engine runs in its own process (tests/trainer/packed_engine.py says how and why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO, clean_environ

TOLERANCE = 1e-5  # fp32 throughout; measured differences are ~5e-7 (log-probs, entropy) and ~1e-6 (gradients)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("packed")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.trainer.packed_engine", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=clean_environ(),  # a module fixture starts before clean_env: not the shell's SEARCHRL_* variables
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _agrees(diff: dict[str, float | None]) -> bool:
    return all(value is None or value < TOLERANCE for key, value in diff.items() if key != "calls")


@pytest.mark.slow
def test_packed_and_padded_give_the_same_log_probs_entropy_and_gradients(runs):
    lengths = runs["lengths"]
    assert runs["padded_calls"] == [
        [len(lengths), max(lengths)]
    ]  # one padded micro batch: 5 rows x 19 tokens
    assert runs["packed"]["calls"] == [[1, sum(lengths)]]  # one packed row of 57 tokens
    assert _agrees(runs["packed"]), runs["packed"]
    assert (
        runs["grad_params"] == 27 and runs["smallest_max_grad"] > 1e-3
    )  # every parameter got a real gradient
    # the forward-only log-prob pass (reference, old policy) too
    assert _agrees(runs["packed_eval"]), runs["packed_eval"]
    # as a GPU run packs: dynamic batching by a token budget (24 here) into several packed micro batches
    assert len(runs["packed_dynamic"]["calls"]) > 1
    assert all(rows == 1 and tokens <= 24 for rows, tokens in runs["packed_dynamic"]["calls"])
    assert _agrees(runs["packed_dynamic"]), runs["packed_dynamic"]


@pytest.mark.slow
@pytest.mark.parametrize("control", ["leak_positions", "leak_use_cache"])
def test_samples_that_see_each_other_fail_the_same_comparison(runs, control):
    """Position ids that count on across samples, or a model call with use_cache=True, leave transformers
    without the packed-sequence mask: attention crosses samples, and the comparison above catches it."""
    diff = runs[control]
    assert diff["calls"] == [[1, sum(runs["lengths"])]]  # the same packed row as the passing run
    assert not _agrees(diff), diff
    assert (
        diff["log_probs"] > 1e-2
    )  # not noise: the first sample alone matches, the later ones read the earlier
