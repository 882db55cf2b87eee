"""`make learn-cpu-real` in seconds (issue 39 item 8): its reward, the variance gate's verdict and null, the pass
criteria, the lr pilot's rule, the per-turn budget the rollout server honours, and the target's wiring.

The run itself (SmolLM2-135M through verl's loop, tens of minutes on 2 cores) is opt-in and not in `make test`;
its numbers are in docs/cpu-proofs.md. The reward through verl's own agent loop and reward manager is
tests/trainer/plugins/test_agent_loop.py::test_the_real_learning_run_caps_the_turn_and_its_reward_scores_the_own_turn_through_verl.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.errors import ConfigError
from searchrl.trainer.cpu.hf_rollout import turn_budget
from searchrl.trainer.plugins.generated_spans import LAST_TURN, TOOL_RESPONSES
from searchrl.trainer.proofs.real_gate import GateResult, check_gate, null_rise
from searchrl.trainer.proofs.real_learn import (
    MIN_DROP,
    RealLearnRun,
    distinct_openings,
    epochs,
    learn_overrides,
    pick_lr,
)
from searchrl.trainer.proofs.rewards import clean_turn_reward, turn_score
from searchrl.trainer.step_checks import COLUMNS, StepRow
from tests.conftest import REPO

GOLD = {"target": ["Ingmar Bergman"]}
CALL = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["who directed it"]}}\n</tool_call>'
OBSERVATION = (
    "<tool_response>\nDoc 1 (Title: The Seventh Seal) ... directed by Ingmar Bergman\n</tool_response>"
)


def trajectory(turn: str, *, response: bool = True) -> str:
    """A response as verl's reward manager decodes it (special tokens skipped, the role words left)."""
    return f"{CALL}\nuser\n{OBSERVATION}\nassistant\n{turn}" if response else f"{CALL}\n"


def record(turn: str, *, response: bool = True) -> dict[str, object]:
    """The extra_info verl's reward manager passes: the agent loop's record of the last generated turn."""
    return {"question": "q", LAST_TURN: turn, TOOL_RESPONSES: 1 if response else 0}


@pytest.mark.parametrize(
    ("turn", "score"),
    [
        ("Ingmar Bergman directed it.", 1.0),
        ("x", 1.0),
        ("", 0.0),
        (" \n\t", 0.0),
        ("<tool_response>\nDoc 1 (Title: Invented) Fritz Lang\n</tool_response>", 0.0),
        ("It was Bergman. <tool_response>", 0.0),
        ("Bergman</tool_response>", 0.0),
    ],
)
def test_the_reward_pays_a_non_empty_own_turn_without_an_invented_tool_response(turn, score):
    assert turn_score(turn) == score
    out = clean_turn_reward("dev", trajectory(turn), GOLD, record(turn))
    assert out["score"] == score and "em" in out  # the production reward's keys are still there


def test_the_own_turn_is_the_recorded_one_not_the_tail_after_an_invented_response():
    """Splitting on the last `</tool_response>` would score only the tail after the invented block (issue 39
    item 4): that tail is clean, so the cheat would score 1. The agent loop's record holds the whole turn."""
    turn = "<tool_response>\nmade up\n</tool_response>\nSo the answer is Lang."
    assert clean_turn_reward("dev", trajectory(turn), GOLD, record(turn))["score"] == 0.0
    assert turn_score("So the answer is Lang.") == 1.0  # what the old split would have scored
    # verl dropped the response (it would cross the budget): nothing to answer
    assert (
        clean_turn_reward("dev", trajectory("", response=False), GOLD, record("", response=False))["score"]
        == 0.0
    )
    assert (
        clean_turn_reward("dev", trajectory("Lang", response=False), GOLD, record("Lang", response=False))[
            "score"
        ]
        == 0.0
    )
    with pytest.raises(ValueError, match="not run by searchrl_tool_agent"):
        clean_turn_reward("dev", trajectory(turn), GOLD, {"question": "q"})  # no record: never guessed


def test_the_null_runs_reward_is_a_coin_flip_whatever_the_turn_and_keeps_the_real_score():
    turn = "<tool_response>\nmade up\n</tool_response>"
    outs = [
        clean_turn_reward("dev", trajectory(turn), GOLD, record(turn), random_rate=0.65) for _ in range(400)
    ]
    assert 0.55 < sum(o["score"] for o in outs) / 400 < 0.75
    assert {o["no_invented_response"] for o in outs} == {0.0}
    assert "+reward.custom_reward_function.reward_kwargs.random_rate=0.65" in learn_overrides(
        "float32", 0, 96, 0.65
    )


def test_the_gate_refuses_when_no_group_varies_and_passes_when_one_does():
    for alike in ([[0.0] * 8] * 10, [[1.0] * 8] * 10):
        with pytest.raises(ConfigError) as info:
            check_gate(GateResult(scores=alike))
        assert "none of 10 groups varies" in str(info.value) and "\n" not in str(info.value)
    one = [[0.0] * 8] * 9 + [[0.0] * 7 + [1.0]]
    check_gate(GateResult(scores=one))
    assert GateResult(scores=one).varying == pytest.approx(0.1)
    assert GateResult(scores=one).mean == pytest.approx(1 / 80)


def test_the_null_is_zero_without_variance_and_near_binomial_noise_with_it():
    assert null_rise([[1.0] * 8] * 10) == 0.0
    half = [[0.0, 1.0] * 4] * 10  # p = 0.5: sd of a difference of two 80-sample means is sqrt(2 * .25 / 80)
    sd = math.sqrt(2 * 0.25 / 80)
    assert 1.3 * sd < null_rise(half) < 2.0 * sd  # the 95th percentile of a normal is 1.645 sd


def _row(step: int, reward: float, invented: float, trajectories: float = 8.0) -> StepRow:
    metrics = {
        COLUMNS["reward"][1]: reward,
        "loss/model_tool_response_tokens": invented * trajectories,
        "search/trajectories": trajectories,
    }
    return StepRow(step=step, run="run", metrics=metrics)


def _run(
    rewards: tuple[float, float], invented: tuple[float, float], probe: tuple[float, float]
) -> RealLearnRun:
    """A run whose gate (the initial policy) scored 0.5 with a null of 0.1, and two epochs of 10 steps."""
    run = RealLearnRun(Path("/nowhere"), Path("/nowhere"), null=0.1, epoch_steps=10)
    run.gate = GateResult(scores=[[0.0, 1.0] * 4] * 10)
    run.rows = [_row(i + 1, rewards[i >= 10], invented[i >= 10]) for i in range(20)]
    run.probe_initial, run.probe_merged = probe
    return run


def test_the_run_passes_only_when_reward_invented_tokens_and_probe_all_agree():
    assert _run((0.5, 0.7), (40.0, 20.0), (0.3, 0.5)).problems() == []
    flat = _run((0.5, 0.55), (40.0, 20.0), (0.3, 0.5)).problems()
    assert len(flat) == 1 and "did not rise beyond the null" in flat[0]
    # the rise counts from the initial policy (the gate), not from epoch 1, which already holds updates
    assert _run((0.95, 1.0), (4.0, 0.0), (0.3, 0.5)).problems() == []
    small_drop = _run((0.5, 0.7), (40.0, 40.0 * (1 - MIN_DROP) + 1), (0.3, 0.5)).problems()
    assert len(small_drop) == 1 and "needs -30%" in small_drop[0]
    nothing = _run((0.5, 0.7), (0.0, 0.0), (0.3, 0.5)).problems()
    assert len(nothing) == 1 and "no invented tool-response tokens" in nothing[0]
    probe = _run((0.5, 0.7), (40.0, 20.0), (0.5, 0.5)).problems()
    assert len(probe) == 1 and "greedy probe did not rise" in probe[0]
    assert (
        _run((0.5, 0.7), (40.0, 20.0), (0.3, 0.5)).line().startswith("learned: reward 0.500 before -> 0.700")
    )


def test_boilerplate_turns_show_as_few_distinct_openings():
    turns = ["This is a classic example of a fallacy.", "this is  a classic example of bias", "Bergman."]
    assert distinct_openings(turns) == 2


def test_the_epochs_must_be_whole():
    rows = [_row(i + 1, 0.5, 1.0) for i in range(19)]
    with pytest.raises(ConfigError, match="not two whole epochs of 10"):
        epochs(rows, 10)
    run = _run((0.5, 0.7), (40.0, 20.0), (0.3, 0.5))
    run.rows = run.rows[:19]
    assert "not two whole epochs" in run.problems()[0]


def test_the_pilot_picks_the_lr_whose_later_steps_scored_best_and_the_smaller_on_a_tie():
    def rows(*rewards: float) -> list[StepRow]:
        return [_row(i + 1, r, 1.0) for i, r in enumerate(rewards)]

    # step 1 samples the initial policy: a lucky first step does not count
    assert pick_lr({3e-5: rows(0.9, 0.5, 0.5), 1e-4: rows(0.1, 0.6, 0.7)}) == 1e-4
    assert pick_lr({3e-5: rows(0.5, 0.6), 1e-4: rows(0.5, 0.6)}) == 3e-5
    with pytest.raises(ConfigError):
        pick_lr({})


def test_the_rollout_server_honours_a_requests_max_tokens_as_vllm_does():
    assert turn_budget(384, 1000, {}) == 384  # verl sets none: the response budget
    assert turn_budget(384, 1000, {"max_tokens": 96}) == 96
    assert turn_budget(384, 50, {"max_tokens": 96}) == 50  # never past the context
    assert turn_budget(384, 1000, {"max_new_tokens": 64}) == 64  # sglang's name
    assert turn_budget(384, 0, {"max_tokens": 96}) == 1


def test_the_run_overrides_carry_the_reward_the_budget_and_bf16(monkeypatch):
    overrides = learn_overrides("bfloat16", 3, 96)
    assert "reward.custom_reward_function.path=pkg://searchrl.trainer.proofs.rewards" in overrides
    assert "reward.custom_reward_function.name=clean_turn_reward" in overrides
    assert "+actor_rollout_ref.rollout.engine_kwargs.searchrl.turn_max_tokens=96" in overrides
    assert "+actor_rollout_ref.rollout.engine_kwargs.hf.dtype=bfloat16" in overrides
    assert "actor_rollout_ref.rollout.seed=3" in overrides


def test_the_cli_routes_model_learn_and_gate_to_the_real_run(monkeypatch, tmp_path, capsys):
    import searchrl.trainer.proofs.real_learn as real

    seen: list[dict] = []

    checks = "checks: 21 syncs fingerprinted, all matched; ..."  # run_real_learn's step_checks.checks_line

    def fake_run(out, model_dir, **kwargs):
        seen.append({"out": out, "model": model_dir, **kwargs})
        run = _run((0.5, 0.7), (40.0, 20.0), (0.3, 0.5))
        run.checks = checks
        return run

    monkeypatch.setattr(real, "run_real_learn", fake_run)
    argv = ["train", "cpu", "real-learn", "--model", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main([*argv, "--lrs", "1e-5,2e-5", "--pilot-steps", "3", "--turn-tokens", "64"]) == 0
    assert seen[-1]["lrs"] == [1e-5, 2e-5] and seen[-1]["pilot_steps"] == 3 and seen[-1]["turn_tokens"] == 64
    assert seen[-1]["gate_only"] is False
    out = capsys.readouterr().out
    assert "learned: reward" in out and f"\n{checks}\n" in out  # the report's closing line, printed
    gate = ["train", "cpu", "gate", "--model", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main(gate) == 0
    assert seen[-1]["gate_only"] is True and "variance gate" in capsys.readouterr().out
    # the old flags pick the same runs for one release, and say so in one line
    old = ["train", "cpu", "--model", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main([*old, "--gate"]) == 0 and seen[-1]["gate_only"] is True
    assert "notice: `searchrl train cpu --model M --gate` is `searchrl train cpu gate --model M` now" in (
        capsys.readouterr().err
    )
    assert main([*old, "--learn"]) == 0 and seen[-1]["gate_only"] is False
    assert main([*argv, "--lrs", "fast"]) == 2
    assert main(["train", "cpu", "gate"]) == 2  # the gate samples a real model
    assert "give --model" in capsys.readouterr().err


def test_make_learn_cpu_real_is_its_own_opt_in_target():
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = text.split("\nlearn-cpu-real:", 1)[1].split("\n\n", 1)[0]
    assert "train cpu real-learn --model $(MODEL)" in recipe
    assert "learn-cpu-real" in text.split(".PHONY:", 1)[1].split("\n", 1)[0]
    test_target = text.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "learn-cpu-real" not in test_target
