"""`searchrl train bench-step-checks` (make bench-step-checks, issue 53) at a small size: it builds a step the
agent loop would, times the sampler's loss-mask checks on it, checks them against the old string path, and ends
with the line the docs quote."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import main
from searchrl.trainer.mask_bench import build_step
from searchrl.trainer.plugins.generated_spans import SPANS, parse_spans


def test_the_bench_times_a_small_step_and_ends_with_its_line(
    offline_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offline_tokenizer.save_pretrained(tmp_path / "tok")
    rc = main(
        ["train", "bench-step-checks", str(tmp_path / "tok"), "--trajectories", "24", "--tokens", "400"]
        + ["--repeats", "2"]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("the driver's loss-mask checks of one training step, 24 x 400 tokens, on ")
    assert "load average" in out[0] and "<tool_response> is" in out[1]
    assert any(line.endswith("the same counts") for line in out)
    text = "\n".join(out)
    assert "loss/observation_tokens_in_loss=0" in text and "loss/mask_outside_generated=0" in text
    assert re.fullmatch(r"step checks: \d+\.\d\d s a step at 24 x 400 tokens", out[-1])


def test_the_step_is_cut_at_its_length_with_masks_and_records_to_match(offline_tokenizer: Any) -> None:
    ids, masks, extras, environment, model = build_step(offline_tokenizer, 12, 300, seed=1)
    assert [len(i) for i in ids] == [len(m) for m in masks] == [300] * 12
    assert environment >= 12 and model > 0
    for mask, extra in zip(masks, extras, strict=True):
        generated = [0] * 300
        for start, end in parse_spans(extra[SPANS]):
            generated[start:end] = [1] * (end - start)
        assert mask.tolist() == generated  # mask 1 exactly on the recorded turns


def test_the_bench_refuses_an_empty_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "bench-step-checks", "unused", "--tokens", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
