"""`make bench-logprobs` (trainer/proofs/logprob_bias.py): the per-cell statistics are verl's |p_rollout - p_actor|, the
table keeps fp32 noise visible, and bad input is one line and exit 2. The measurement itself needs vLLM's CPU
build and ~1 h on 2 shared cores (docs/training.md has its table)."""

from __future__ import annotations

import math

import pytest

from searchrl.trainer.proofs import logprob_bias as bias


def test_summarize_is_verls_probability_difference():
    rollout = [[math.log(0.5), math.log(0.2)], [math.log(0.9)]]
    actor = [[math.log(0.4), math.log(0.2)], [math.log(0.6)]]
    cell = bias.summarize("processed_logprobs", 0.95, "float32", rollout, actor)
    assert cell.tokens == 3
    assert cell.mean == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert cell.median == pytest.approx(0.1) and cell.max == pytest.approx(0.3)
    with pytest.raises(ValueError):  # a token without its actor log-prob is a bug, not a shorter mean
        bias.summarize("raw_logprobs", 1.0, "float32", [[0.0, 0.0]], [[0.0]])


def test_the_table_shows_fp32_noise_and_every_cell():
    cells = [
        bias.CellResult("raw_logprobs", 0.95, "float32", 3254, 9.15e-7, 3.4e-7, 1.2e-5, -2.3),
        bias.CellResult("processed_logprobs", 0.95, "bfloat16", 3178, 0.0145, 0.0064, 0.0918, -2.4),
    ]
    table = bias.markdown(cells)
    assert "| raw_logprobs | 0.95 | float32 | 3,254 | 9.2e-07 | 3.4e-07 | 1.2e-05 |" in table
    assert "| processed_logprobs | 0.95 | bfloat16 | 3,178 | 0.0145 | 0.0064 | 0.0918 |" in table
    assert len(bias.MODES) * len(bias.TOP_PS) * len(bias.DTYPES) == 8


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert bias.main(["--model", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    (tmp_path / "config.json").write_text("{}")
    assert bias.main(["--model", str(tmp_path), "--samples", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
