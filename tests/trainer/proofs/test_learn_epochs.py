"""The learning run's per-question figures (trainer/proofs/learn_epochs.py), on dumps written by verl's own dump writer.

Whole-epoch windows are refused when the settings cannot give them (issue 39 item 7: `--questions 7` silently
compared unbalanced windows before), and a run whose dumps show unequal windows fails instead of reporting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.proofs.learn_epochs import (
    Trajectory,
    epoch_steps,
    groups_varying,
    paired_first_last_group,
    paired_rise,
    read_dumps,
)

QUESTIONS = ["Which river flows through Paris?", "Who wrote Hamlet?", "What is the capital of Peru?"]


def _dump(folder: Path, step: int, rows: list[tuple[str, int, float]]) -> None:
    """verl 0.9.1's own writer (v1 trainer `_write_generations`): rows are (question, sample, score)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    inputs = [
        f"system\nYou are a helpful assistant.\nuser\nAnswer the question. Question: {q}\nassistant\n"
        for q, _, _ in rows
    ]
    keys = [f"uid{step}{QUESTIONS.index(q)}_{sample}_0" for q, sample, _ in rows]
    PPOTrainer._write_generations(
        inputs,
        ["out"] * len(rows),
        [None] * len(rows),
        [s for _, _, s in rows],
        {"uid": keys},
        str(folder),
        step,
    )


def _epochs(folder: Path, scores: dict[int, dict[str, list[float]]]) -> list[Trajectory]:
    for step, per_question in scores.items():
        _dump(folder, step, [(q, i, s) for q, ss in per_question.items() for i, s in enumerate(ss)])
    return read_dumps(folder, QUESTIONS)


def test_windows_must_be_whole_epochs_or_the_run_is_refused():
    assert epoch_steps(10, 2, 20) == 5  # the default: 12 questions, 2 held out, 2 prompts a step
    with pytest.raises(ConfigError, match="6 train rows do not"):  # fine: 3-step epochs ...
        epoch_steps(6, 4, 20)
    with pytest.raises(ConfigError, match="20 steps are not a whole number .* of 3-step epochs"):
        epoch_steps(6, 2, 20)  # --questions 7: 6 train rows, 3-step epochs, 20 steps
    with pytest.raises(ConfigError, match="train rows do not split into whole steps"):
        epoch_steps(11, 2, 20)  # --questions 13: one question left out of every epoch
    with pytest.raises(ConfigError, match="not a whole number \\(at least 2\\)"):
        epoch_steps(40, 2, 20)  # one epoch: first and last would be the same window


def test_learn_cpu_refuses_questions_7_with_one_line_before_anything_starts(tmp_path, capsys):
    from searchrl.cli import main

    assert main(["train", "cpu", "learn", "--questions", "7", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-2000:]
    assert "20 steps are not a whole number (at least 2) of 3-step epochs (6 train rows" in errors[0]
    assert not (tmp_path / "seed-0").exists()


def test_paired_rise_compares_each_question_with_itself(tmp_path):
    q0, q1 = QUESTIONS[:2]
    trajectories = _epochs(
        tmp_path,
        {
            1: {q0: [0.2, 0.4]},
            2: {q1: [0.6, 0.6]},
            3: {q1: [0.7, 0.9]},
            4: {q0: [0.1, 0.1]},
        },
    )
    assert {(t.step, t.question, t.score) for t in trajectories} >= {(1, q0, 0.2), (4, q0, 0.1)}
    paired = paired_rise(trajectories, epoch=2, steps=4)
    assert paired.first == pytest.approx({q0: 0.3, q1: 0.6})
    assert paired.last == pytest.approx({q0: 0.1, q1: 0.8})
    assert paired.rises == pytest.approx({q0: -0.2, q1: 0.2}) and paired.rose == 1
    assert paired.line() == "per question (first epoch -> last, paired): 0.450 -> 0.450 (+0.000), 1 of 2 rose"
    # a group whose samples all scored alike gives GRPO nothing: step 2 and step 4
    assert groups_varying(trajectories) == {1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0}


def test_unequal_windows_fail_instead_of_weighing_questions_unequally(tmp_path):
    q0, q1, q2 = QUESTIONS
    trajectories = _epochs(
        tmp_path,
        {1: {q0: [0.2, 0.4]}, 2: {q0: [0.6, 0.6], q1: [0.1, 0.1]}, 3: {q1: [0.1, 0.2]}, 4: {q2: [0.3, 0.3]}},
    )
    with pytest.raises(SmokeCheckError, match="the first epoch .* sampled its questions unequally"):
        paired_rise(trajectories, epoch=2, steps=4)
    with pytest.raises(SmokeCheckError, match="the first and last epochs sampled different questions"):
        paired_rise([t for t in trajectories if t.step != 2], epoch=2, steps=4)


def test_an_output_holding_a_unicode_line_separator_stays_one_row(tmp_path):
    """verl writes rows with ensure_ascii=False: a random model's output with U+0085 (a shuffle_rewards run in
    separate_async sampled one) or U+2028 is one JSON row, though str.splitlines would cut it in two."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    q0, q1, _ = QUESTIONS
    PPOTrainer._write_generations(
        [f"Question: {q0}", f"Question: {q1}"],
        ["a\x85b", "c\u2028d\u2029e"],
        [None, None],
        [0.25, 0.5],
        {"uid": ["g0_0_0", "g1_0_0"]},
        str(tmp_path),
        3,
    )
    assert read_dumps(tmp_path, QUESTIONS) == [Trajectory(3, q0, "g0", 0.25), Trajectory(3, q1, "g1", 0.5)]


def test_a_prompt_that_names_no_train_question_is_an_error(tmp_path):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    PPOTrainer._write_generations(
        ["Question: something else"], ["x"], [None], [0.5], {"uid": ["a_0_0"]}, str(tmp_path), 1
    )
    with pytest.raises(SmokeCheckError, match="holds 0 of the run's train questions"):
        read_dumps(tmp_path, QUESTIONS)
    with pytest.raises(SmokeCheckError, match="no rollout dump"):
        read_dumps(tmp_path / "empty", QUESTIONS)


def test_an_async_run_compares_each_questions_first_trained_group_with_its_last(tmp_path):
    """verl's async modes train whichever groups finished first, so windows of whole epochs do not exist (the
    separate_async learning run's last 5 steps trained two questions twice and two not at all): the async
    comparison is each question's first group against its last, and a sync run keeps its epoch windows."""
    from searchrl.trainer.proofs.learn import LearnRun

    q0, q1, q2 = QUESTIONS
    trajectories = _epochs(
        tmp_path,
        {
            1: {q0: [0.2, 0.4], q1: [0.5, 0.5]},
            2: {q0: [0.6, 0.6], q2: [0.3, 0.3]},
            3: {q1: [0.9, 0.7], q2: [0.4, 0.6]},
            4: {q0: [0.8, 0.8], q1: [0.1, 0.3]},
        },
    )
    paired = paired_first_last_group(trajectories)
    assert paired.first == pytest.approx({q0: 0.3, q1: 0.5, q2: 0.3})
    assert paired.last == pytest.approx({q0: 0.8, q1: 0.2, q2: 0.5})
    assert paired.rose == 2
    assert paired.line().startswith("per question (first group -> last, paired): 0.367 -> 0.500 (+0.133)")
    run = LearnRun(seed=0, out_dir=tmp_path, mode="separate_async", epoch=2, trajectories=trajectories)
    assert run.paired().rises == pytest.approx(paired.rises)
    with pytest.raises(SmokeCheckError, match="sampled its questions unequally"):
        LearnRun(seed=0, out_dir=tmp_path, epoch=2, trajectories=trajectories).paired()
    # a question whose other draws were evicted has no rise: left out and said so, the others still compared
    once = paired_first_last_group([t for t in trajectories if not (t.question == q2 and t.step == 3)])
    assert set(once.first) == {q0, q1} and once.left_out == 1
    assert once.mean_rise == pytest.approx((0.5 - 0.3) / 2)
    assert once.line().endswith("1 of 2 rose (1 trained once, left out)")
    with pytest.raises(SmokeCheckError, match="2 of 3 questions were trained in fewer than two groups"):
        paired_first_last_group([t for t in trajectories if t.step <= 2])
