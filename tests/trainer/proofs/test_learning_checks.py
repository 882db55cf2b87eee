"""The pieces the learning run's checks rest on, each shown to catch what it is for (issue 31).

The run itself is tests/trainer/e2e/test_learn_cpu.py; these are the parts that can be checked in milliseconds: the
loss-mask span finder, the learning reward, the rollout engine's log-probs and weight updates, the sabotage
switches, and the step checks on rows a broken run would log.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.cpu import sabotage
from searchrl.trainer.cpu.hf_log import BATCH_PATTERN, UPDATE_LINE
from searchrl.trainer.cpu.hf_rollout import (
    HFGenerateServer,
    first_stop,
    missing_weights,
    sampled_log_probs,
)
from searchrl.trainer.plugins.generated_spans import LAST_TURN, TOOL_RESPONSES
from searchrl.trainer.plugins.masks import (
    mask_step_metrics,
    observation_counts,
    observation_spans,
    tool_response_spans,
)
from searchrl.trainer.proofs.learn import (
    MIN_VARYING,
    WINDOW,
    LearnRun,
    count_updates,
    learned_line,
    summarize,
)
from searchrl.trainer.proofs.learn_epochs import Trajectory
from searchrl.trainer.proofs.rewards import answer_char_share, answer_chars_reward, own_turn
from searchrl.trainer.step_checks import (
    SYNC_MAX_PROB_DIFF,
    StepRow,
    gpu_step_problems,
    sync_and_mask_problems,
)
from searchrl.trainer.weight_sync.fingerprint import fingerprint

# ---- loss-mask spans -----------------------------------------------------------------------------------------


def test_spans_cover_the_tool_response_tokens_whatever_the_tokenisation():
    pieces = [
        "I",
        " search",
        "<tool",
        "_response",
        ">\nDoc",
        " 1",
        "</tool_",
        "response>",
        "<|im_end|>",
        "ok",
    ]
    assert observation_spans(pieces) == [(2, 8)]
    assert observation_counts(pieces, [1, 1, 0, 0, 0, 0, 0, 0, 0, 1]) == (6, 0)
    assert observation_counts(pieces, [1, 1, 0, 0, 1, 0, 0, 0, 0, 1]) == (6, 1)  # one trained token inside


def test_a_response_cut_off_by_the_budget_runs_to_the_end_and_several_are_counted():
    pieces = ["<tool_response>", "a", "</tool_response>", "x", "<tool_response>", "b", "c"]
    assert observation_spans(pieces) == [(0, 3), (4, 7)]
    metrics = mask_step_metrics([(pieces, [0, 0, 0, 1, 0, 1, 1]), (["no", "tool"], [1, 1])])
    assert metrics == {
        "loss/observation_tokens": 6.0,
        "loss/observation_tokens_in_loss": 2.0,
        "loss/model_tool_response_tokens": 0.0,
        "loss/trained_tokens": 5.0,
    }


def test_a_tool_response_the_model_writes_itself_is_its_own_text_not_an_observation(offline_tokenizer):
    """SmolLM2 made up `<tool_response>` blocks in its own turn (issue 32): trained on, rightly, as its sample.
    The environment's block in the user turn stays an observation, and in the loss it is still caught."""
    scripted = '<tool_call>\n{"name": "search"}\n</tool_call><|im_end|>\n'
    observation = "<|im_start|>user\n<tool_response>\nDoc 1 (Title: X) passage\n</tool_response><|im_end|>\n"
    own = "<|im_start|>assistant\n<tool_response>\nmade up\n</tool_response> so X<|im_end|>"
    pieces, env_end = [], 0
    for part in (scripted, observation, own):
        pieces += offline_tokenizer.convert_ids_to_tokens(
            offline_tokenizer.encode(part, add_special_tokens=False)
        )
        if part is observation:
            env_end = len(pieces)
    scripted_len = len(offline_tokenizer.encode(scripted, add_special_tokens=False))
    spans = tool_response_spans(pieces)
    assert [env for _, _, env in spans] == [True, False]
    mask = [0] * env_end + [1] * (len(pieces) - env_end)  # the model's turn is trained on
    metrics = mask_step_metrics([(pieces, mask)])
    assert metrics["loss/observation_tokens_in_loss"] == 0 and metrics["loss/model_tool_response_tokens"] > 0
    leaky = [0] * scripted_len + [1] * (
        len(pieces) - scripted_len
    )  # sabotage: the observation trained on too
    assert mask_step_metrics([(pieces, leaky)])["loss/observation_tokens_in_loss"] > 0


def test_the_spans_are_found_in_a_real_tokenizers_token_strings(offline_tokenizer):
    text = (
        "<|im_start|>user\n<tool_response>\nDoc 1 (Title: X) some passage\n</tool_response><|im_end|>\nanswer"
    )
    ids = offline_tokenizer.encode(text, add_special_tokens=False)
    pieces = offline_tokenizer.convert_ids_to_tokens(ids)
    ((start, end),) = observation_spans(pieces)
    inside = offline_tokenizer.decode(ids[start:end])
    assert inside.startswith("<tool_response>") or "<tool_response>" in inside[:20]
    assert inside.rstrip().endswith("</tool_response>") and "answer" not in inside


# ---- the learning reward -------------------------------------------------------------------------------------


def test_the_learning_reward_scores_the_recorded_own_turn_and_refuses_a_trajectory_without_one():
    solution = '<tool_call>{"q": 1}</tool_call>\n<tool_response>\nzzzz\n</tool_response>\nassistant\nbbb xx'
    record = {LAST_TURN: "bbb xx", TOOL_RESPONSES: 1}
    assert own_turn(record) == "bbb xx"
    assert (
        own_turn({LAST_TURN: "bbb xx", TOOL_RESPONSES: 0}) == ""
    )  # no tool response reached it: nothing to score
    assert answer_char_share("bbb xx", ["Bob"]) == pytest.approx(3 / 5)
    assert answer_char_share("", ["Bob"]) == 0.0 and answer_char_share("abc", []) == 0.0
    info = {"search_calls": 1, "search_failures": 0, **record}
    out = answer_chars_reward("dev", solution, {"target": ["Bob"]}, info)
    assert out["score"] == out["answer_char_share"] == pytest.approx(3 / 5)
    assert out["em"] == 0.0 and out["search_calls"] == 1.0  # the production reward's keys are all there
    with pytest.raises(ValueError, match="not run by searchrl_tool_agent"):
        answer_chars_reward("dev", solution, {"target": ["Bob"]}, {"search_calls": 1, "search_failures": 0})


# ---- the rollout engine --------------------------------------------------------------------------------------


def test_log_probs_are_those_of_the_tempered_distribution_sampling_used():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]])
    tokens = torch.tensor([0, 2])
    at_half = sampled_log_probs(logits, tokens, 0.5)
    expected = torch.log_softmax(logits / 0.5, dim=-1)[torch.arange(2), tokens]
    assert torch.allclose(at_half, expected)
    assert not torch.allclose(at_half, sampled_log_probs(logits, tokens, 1.0))  # T=1 would be wrong at T=0.5
    assert torch.allclose(sampled_log_probs(logits, tokens, 0.0), sampled_log_probs(logits, tokens, 1.0))


def test_only_a_tied_lm_head_may_be_missing_from_an_update():
    own = {"embed.weight", "lm_head.weight", "layer.0.weight"}
    assert missing_weights(own, {"embed.weight", "layer.0.weight"}, tied_embeddings=True) == []
    assert missing_weights(own, {"embed.weight", "layer.0.weight"}, tied_embeddings=False) == [
        "lm_head.weight"
    ]
    assert missing_weights(own, {"embed.weight"}, tied_embeddings=True) == ["layer.0.weight"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from searchrl.trainer.cpu.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny"), ["hello world", "<tool_call>search</tool_call>"])


@pytest.mark.parametrize("stale", [False, True], ids=["synced", "sabotage-stale-sync"])
def test_the_server_loads_whole_updates_counts_them_and_refuses_partial_ones(
    tiny_model_dir, monkeypatch, capsys, stale
):
    if stale:
        monkeypatch.setenv(sabotage.ENV, sabotage.STALE_SYNC)
    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=8)
    trained = {name: t + 0.5 for name, t in server.model.state_dict().items()}
    partial = {name: t for name, t in trained.items() if "layers.1." not in name}
    with pytest.raises(ValueError, match=r"update lacks \d+ of the model's \d+ weights"):
        server.update_weights(partial, global_steps=1)
    assert server.weight_updates == 0
    held = server.update_weights(trained, global_steps=3)
    assert (held == fingerprint(trained.items())) is not stale  # what it holds, not what it was sent
    assert server.stats()["global_steps"] == 3 and server.stats()["weight_updates"] == 1
    line = capsys.readouterr().out.strip()
    assert count_updates(line) == [3] and line.startswith(UPDATE_LINE.split("{")[0])
    loaded = server.model.state_dict()
    moved = all(torch.equal(loaded[name], trained[name]) for name in trained)
    assert moved is not stale and ("IGNORED" in line) is stale


def _full_forward_probs(server: HFGenerateServer, prompt: list[int], new: list[int], temperature: float):
    with torch.no_grad():
        logits = server.model(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]
    return sampled_log_probs(logits, torch.tensor(new), temperature).exp()


def test_concurrent_turns_run_as_one_batch_with_the_sampling_pass_log_probs(tiny_model_dir, capsys):
    """Six turns of different prompt lengths arrive together: one left-padded generate serves them all, each
    sequence stops at EOS or its own budget, and the log-probs it returns (from the sampling pass) are those a
    separate full forward gives, to fp32 noise: the rollout/actor sync check rests on them."""
    import asyncio

    server = HFGenerateServer(str(tiny_model_dir), prompt_length=24, response_length=12, gather_s=0.05)
    prompts = [[5 + i + j for j in range(3 + 3 * i)] for i in range(6)]  # 3 to 18 tokens: budgets differ

    async def turns():
        return await asyncio.gather(
            *[server.generate(str(i), p, {"temperature": 0.7, "top_p": 1.0}) for i, p in enumerate(prompts)]
        )

    outs = asyncio.run(turns())
    assert server.stats()["batches"] == 1 and server.stats()["sequences"] == 6
    ((n, tokens, _seconds),) = re.findall(BATCH_PATTERN, capsys.readouterr().out)
    assert int(n) == 6 and int(tokens) == sum(len(o.token_ids) for o in outs)
    eos = server.tokenizer.eos_token_id
    for prompt, out in zip(prompts, outs, strict=True):
        budget = min(12, 24 + 12 - len(prompt))
        assert 1 <= len(out.token_ids) <= budget and len(out.log_probs) == len(out.token_ids)
        assert eos not in out.token_ids[:-1]  # nothing after a stop
        recomputed = _full_forward_probs(server, prompt, out.token_ids, 0.7)
        assert torch.allclose(torch.tensor(out.log_probs).exp(), recomputed, atol=1e-5)


def test_a_failed_batch_fails_every_caller_instead_of_hanging(tiny_model_dir, monkeypatch):
    import asyncio

    server = HFGenerateServer(str(tiny_model_dir), prompt_length=8, response_length=4, gather_s=0.01)

    def broken(batch):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(server, "generate_batch", broken)

    async def turns():
        return await asyncio.gather(
            *[server.generate(str(i), [5, 6, 7], {"temperature": 1.0}) for i in range(3)],
            return_exceptions=True,
        )

    results = asyncio.run(asyncio.wait_for(turns(), timeout=30))
    assert [str(r) for r in results] == ["out of memory"] * 3


def test_first_stop_keeps_the_stop_token_and_nothing_after():
    assert first_stop([4, 5, 2, 2, 2], {2}) == 3
    assert first_stop([4, 5, 6], {2}) == 3
    assert first_stop([], {2}) == 0


# ---- sabotage switches ---------------------------------------------------------------------------------------


def test_an_unknown_sabotage_name_is_refused(monkeypatch):
    monkeypatch.setenv(sabotage.ENV, "stale-sync")
    with pytest.raises(ConfigError, match="not one of stale_sync"):
        sabotage.current()
    monkeypatch.delenv(sabotage.ENV)
    assert sabotage.current() is None and not sabotage.active(sabotage.STALE_SYNC)


def test_flipped_advantages_are_verls_grpo_advantages_negated(monkeypatch):
    from verl.trainer.ppo import core_algos

    monkeypatch.setattr(
        core_algos, "compute_grpo_outcome_advantage", core_algos.compute_grpo_outcome_advantage
    )
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.2], [0.0, 0.9], [0.0, 0.1]])
    mask = torch.ones_like(rewards)
    index = ["a", "a", "b", "b"]
    honest, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    sabotage.flip_advantages()
    flipped, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    assert honest[0, 0] > 0 and torch.allclose(flipped, -honest)


def test_misjoined_scores_move_every_trajectory_and_repeat_with_the_seed():
    perms = [sabotage.misjoin(16, torch.Generator().manual_seed(sabotage.SHUFFLE_SEED)) for _ in range(2)]
    assert torch.equal(perms[0], perms[1])  # seeded: the sabotaged run is reproducible
    assert sorted(perms[0].tolist()) == list(range(16))  # a permutation: the step's scores, re-joined
    assert all(perms[0] != torch.arange(16))  # nobody keeps its own score
    assert sabotage.misjoin(1, torch.Generator().manual_seed(0)).tolist() == [0]


def _advantages_through_verls_v1_trainer(monkeypatch, scores: list[float]) -> torch.Tensor:
    """Per-trajectory advantages from verl's own v1 trainer method `_compute_advantage` (what a training step
    calls, which reaches GRPO through v1/utils.py and ray_trainer.compute_advantage) on a batch of two prompts x
    two samples; TransferQueue is a stand-in that serves the batch's fields and keeps what verl writes back."""
    from tensordict import TensorDict
    from tensordict.tensorclass import NonTensorData, NonTensorStack
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    uids, lengths = ["a", "a", "b", "b"], [3, 2, 4, 3]
    rows = [torch.tensor([0.0] * (n - 1) + [score]) for n, score in zip(lengths, scores, strict=True)]
    fields = TensorDict(
        {
            "uid": NonTensorStack(*[NonTensorData(uid) for uid in uids]),
            "response_mask": torch.nested.as_nested_tensor(
                [torch.ones(n, dtype=torch.long) for n in lengths], layout=torch.jagged
            ),
            "rm_scores": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
        },
        batch_size=4,
    )
    written: dict[str, TensorDict] = {}

    class TransferQueue:
        def kv_batch_get(self, keys, partition_id, select_fields):
            return fields.select(*[name for name in select_fields if name in fields.keys()])

        def kv_batch_put(self, keys, partition_id, fields):
            written["fields"] = fields

    monkeypatch.setattr(trainer_base, "tq", TransferQueue())
    config = {
        "algorithm": {"use_kl_in_reward": False, "adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0},
        "actor_rollout_ref": {"rollout": {"n": 2}},
    }
    from omegaconf import OmegaConf

    trainer = type("Trainer", (), {"config": OmegaConf.create(config)})()
    keys = [f"{uid}_{i % 2}_0" for i, uid in enumerate(uids)]  # verl's {uid}_{session}_{output} keys
    batch = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
    trainer_base.PPOTrainer._compute_advantage(trainer, batch, metrics={})
    return torch.stack([row[0] for row in written["fields"]["advantages"].unbind(0)])


@pytest.mark.parametrize("name", [sabotage.FLIP_ADVANTAGE, sabotage.SHUFFLE_REWARDS])
def test_verls_training_step_calls_the_advantage_function_the_sabotages_patch(monkeypatch, name):
    """A verl upgrade that computes GRPO advantages without looking up `core_algos.compute_grpo_outcome_advantage`
    would make flip_advantage and shuffle_rewards silent no-ops (the run would learn and the sabotage test would
    "fail to fail" only after 20 steps, or pass for the wrong reason): here verl's own step method must call it."""
    from verl.trainer.ppo import core_algos

    monkeypatch.setattr(
        core_algos, "compute_grpo_outcome_advantage", core_algos.compute_grpo_outcome_advantage
    )
    scores = [1.0, 0.2, 0.9, 0.1]
    honest = _advantages_through_verls_v1_trainer(monkeypatch, scores)
    assert torch.allclose(honest, torch.tensor([1.0, -1.0, 1.0, -1.0]) / 2**0.5, atol=1e-4)
    if name == sabotage.FLIP_ADVANTAGE:
        sabotage.flip_advantages()
        assert torch.allclose(_advantages_through_verls_v1_trainer(monkeypatch, scores), -honest)
        return
    perm = sabotage.misjoin(
        4, torch.Generator().manual_seed(sabotage.SHUFFLE_SEED)
    )  # the wrapper's first draw
    misjoined = _advantages_through_verls_v1_trainer(monkeypatch, [scores[i] for i in perm.tolist()])
    sabotage.shuffle_rewards()
    shuffled = _advantages_through_verls_v1_trainer(monkeypatch, scores)
    assert torch.allclose(shuffled, misjoined) and not torch.allclose(shuffled, honest)


# ---- the step checks -----------------------------------------------------------------------------------------


def _row(step: int, run: str = "1", **values: float) -> StepRow:
    metrics = {
        "search/calls": 16.0,
        "search/model_calls": 0.0,
        "training/rollout_probs_diff_max": 1e-7,
        "loss/observation_tokens_in_loss": 0.0,
        "loss/observation_tokens": 900.0,
        "loss/mask_outside_generated": 0.0,
        "loss/mask_missing_in_generated": 0.0,
        "loss/unrecorded_trajectories": 0.0,
        "critic/score/mean": 0.3,
        "critic/score/max": 0.6,
        "critic/score/min": 0.1,
        "critic/advantages/max": 1.5,
        "actor/pg_loss": 0.01,
        "actor/grad_norm": 0.2,
    }
    for key, value in values.items():
        metrics[key.replace("__", "/")] = value
    return StepRow(step, run, metrics)


def test_sync_and_mask_checks_name_what_broke():
    assert sync_and_mask_problems(_row(1)) == []
    stale = sync_and_mask_problems(_row(2, training__rollout_probs_diff_max=10 * SYNC_MAX_PROB_DIFF))
    assert stale and "sync max prob diff" in stale[0]
    assert (
        "sync max prob diff nan"
        in sync_and_mask_problems(_row(3, training__rollout_probs_diff_max=math.nan))[0]
    )
    leaked = sync_and_mask_problems(_row(4, loss__observation_tokens_in_loss=40.0))
    assert leaked == ["step 4: observation tokens in loss 40 (tool responses are trained on)"]
    blind = sync_and_mask_problems(_row(5, loss__observation_tokens=0.0))
    assert "no tool-response token was found" in blind[0]


def test_the_mask_invariant_fails_a_step_on_each_count_and_on_a_missing_one():
    """Issue 39 item 3: mask 1 off the generated tokens, mask 0 on them, and an unrecorded trajectory each fail."""
    assert sync_and_mask_problems(_row(1, loss__mask_outside_generated=12.0)) == [
        "step 1: 12 loss-mask tokens outside what the rollout server generated (environment text is trained on)"
    ]
    assert sync_and_mask_problems(_row(1, loss__mask_missing_in_generated=3.0)) == [
        "step 1: 3 generated tokens with loss mask 0 (the policy's own samples are left out of the loss)"
    ]
    (unrecorded,) = sync_and_mask_problems(_row(1, loss__unrecorded_trajectories=16.0))
    assert unrecorded.startswith("step 1: 16 trajectories without the agent loop's record")
    for key in ("loss/mask_outside_generated", "loss/unrecorded_trajectories"):
        assert sync_and_mask_problems(_without(_row(1), key)) == [
            f"step 1: verl logged no {key}, so the mask invariant is unchecked"
        ]


def _without(row: StepRow, key: str) -> StepRow:
    return StepRow(row.step, row.run, {k: v for k, v in row.metrics.items() if k != key})


def test_gpu_step_checks_fail_on_a_missing_metric_and_judge_one_step_alone_only_at_the_ceiling():
    """A GPU step fails, never passes, when a check's metric is missing (the check did not run), on tool responses in
    the loss, and when it searched but saw no tool-response token (a template that never writes the tag). Judged
    alone (no run's watch), one step over verl's 0.01 is a warning; one at the ceiling fails (the series rules are
    tests/trainer/test_step_checks.py)."""
    ok = _row(1, training__rollout_probs_diff_mean=1e-3)
    assert gpu_step_problems(ok) == ([], [])
    assert gpu_step_problems(_row(1, training__rollout_probs_diff_mean=0.01)) == (
        [],
        ["step 1: rollout/actor mean prob diff 0.01 >= 0.01 (1 of 3 steps in a row stop the run)"],
    )
    assert (
        "0.05 >= 0.05 on one step" in gpu_step_problems(_row(1, training__rollout_probs_diff_mean=0.05))[0][0]
    )
    for key, what in [
        ("training/rollout_probs_diff_mean", "the weight sync"),
        ("loss/observation_tokens_in_loss", "the loss mask"),
        ("loss/observation_tokens", "the loss mask"),
        ("search/calls", "the loss mask"),
        ("loss/mask_outside_generated", "the mask invariant"),
        ("loss/mask_missing_in_generated", "the mask invariant"),
        ("loss/unrecorded_trajectories", "the mask invariant"),
    ]:
        failures, _ = gpu_step_problems(_without(ok, key))
        assert failures == [f"step 1: verl logged no {key}, so {what} is unchecked"] or (
            key == "training/rollout_probs_diff_mean"
            and failures[0].startswith(f"step 1: verl logged no {key}")
        ), (key, failures)
    leaked, _ = gpu_step_problems(
        _row(1, training__rollout_probs_diff_mean=1e-3, loss__observation_tokens_in_loss=3.0)
    )
    assert leaked == ["step 1: observation tokens in loss 3 (tool responses are trained on)"]
    blind, _ = gpu_step_problems(
        _row(1, training__rollout_probs_diff_mean=1e-3, loss__observation_tokens=0.0)
    )
    assert blind == ["step 1: searched but no tool-response token was found to check the mask on"]
    no_search = _row(
        1, training__rollout_probs_diff_mean=1e-3, search__calls=0.0, loss__observation_tokens=0.0
    )
    assert gpu_step_problems(no_search) == ([], [])


def _learn_run(rewards: list[float], spread: float = 0.05, **values: float) -> LearnRun:
    """A run whose step s trains questions 2((s-1) mod 5) and the next, 8 samples each, scoring around the step's
    reward (+-spread; spread 0: every group scores alike)."""
    rows = [
        _row(i + 1, "1" if i < 10 else "2 (resumed)", critic__score__mean=r, **values)
        for i, r in enumerate(rewards)
    ]
    trajectories = [
        Trajectory(
            step, f"question {2 * ((step - 1) % WINDOW) + k}", f"g{step}{k}", r + spread * (-1) ** sample
        )
        for step, r in enumerate(rewards, start=1)
        for k in range(2)
        for sample in range(8)
    ]
    run = LearnRun(seed=0, out_dir=None, rows=rows, trajectories=trajectories)  # type: ignore[arg-type]
    run.updates = {"1": list(range(0, 11)), "2 (resumed)": list(range(10, len(rewards) + 1))}
    run.probe_initial, run.probe_merged, run.weight_change = 0.30, 0.60, 0.2
    run.probe_rotated_initial, run.probe_rotated_merged = 0.31, 0.55
    return run


def test_the_learning_checks_pass_a_rising_run_and_name_each_failure(monkeypatch):
    import searchrl.trainer.proofs.learn as learn

    monkeypatch.setattr(learn, "check_steps", lambda rows, steps: [])  # columns are check_steps' own test
    rising = [0.3] * WINDOW + [0.4] * 10 + [0.6] * WINDOW
    assert _learn_run(rising).problems() == []
    flat = _learn_run([0.3] * 20).problems()
    assert flat == [
        "reward did not rise: per question (first epoch -> last, paired): 0.300 -> 0.300 (+0.000), 0 of 10 rose "
        "(needs +0.05)"
    ]
    no_adv = _learn_run(rising, critic__advantages__max=0.0, actor__pg_loss=0.0).problems()
    assert no_adv == ["only 0 of 20 steps had a positive advantage"]
    # an honest step can log a loss of exactly 0 (equal-length responses: the advantages' mean); only a gradient of
    # 0 with advantages present means they never reached the update
    assert _learn_run(rising, actor__pg_loss=0.0).problems() == []
    no_grad = _learn_run(rising, actor__grad_norm=0.0).problems()
    assert any(p.startswith("step 1: advantages up to 1.5 but grad norm 0 ") for p in no_grad), no_grad
    run = _learn_run(rising)
    run.updates["2 (resumed)"] = run.updates["2 (resumed)"][:-1]
    run.probe_merged, run.weight_change = 0.31, 0.0
    problems = "; ".join(run.problems())
    assert "run 2 (resumed): the rollout server received weight updates for steps [10, 11" in problems
    assert "the merged weights equal the initial weights" in problems
    assert "probe did not move: 0.300 -> 0.310" in problems
    assert learned_line([_learn_run(rising)]) == (
        "learned: reward per question, first epoch -> last 0.300 -> 0.600 (+0.300), 10 of 10 rose; last epoch's "
        "groups varying 1.00; sync max prob diff 1e-07; observation tokens in loss 0; model-written searches 0"
    )
    assert _learn_run(rising).specificity() == pytest.approx((-0.01, 0.05))


def test_an_async_learning_run_is_not_held_to_the_sync_bound_its_stale_steps_cannot_meet():
    """In verl's async modes a step may train on trajectories sampled by older weights, so the rollout/actor
    probability difference is not a sync check there (step_checks.async_step_problems checked each step's versions
    as verl logged it); a sync run keeps the 1e-4 bound."""
    rising = [0.3] * WINDOW + [0.4] * 10 + [0.6] * WINDOW
    stale = {
        "training__rollout_probs_diff_max": 0.05,
        # the step table's other columns, which check_steps requires (the other tests stub check_steps)
        "search__trajectories": 16.0,
        "search__scripted_calls": 16.0,
        "search__failures": 0.0,
        "response_length__mean": 190.0,
        "timing_s__step": 3.0,
    }
    sync = _learn_run(rising, **stale).problems()
    assert any("sync max prob diff 0.05 above 1e-04" in p for p in sync), sync
    run = _learn_run(rising, **stale)
    run.mode = "separate_async"
    assert run.problems() == []


def test_an_async_mode_judges_the_rise_and_probe_on_the_seeds_mean_and_every_other_check_per_seed(
    monkeypatch,
):
    """One async seed is too noisy to judge alone (separate_async seeds rose +0.014 to +0.124): the rise and the
    probe are judged on the mean over at least 3 seeds, every other check on each seed, and sync stays per seed."""
    import searchrl.trainer.proofs.learn as learn

    monkeypatch.setattr(learn, "check_steps", lambda rows, steps, bound=None: [])

    def runs(ends: list[float], mode: str = "separate_async") -> list[LearnRun]:
        out = []
        for seed, end in enumerate(ends):
            run = _learn_run([0.3] * WINDOW + [0.35] * 10 + [end] * WINDOW)
            run.seed, run.mode = seed, mode
            out.append(run)
        return out

    # seed 0 alone would fail (+0.01), the mean over three seeds rises +0.07
    mixed = runs([0.31, 0.40, 0.40])
    assert mixed[0].learning_problems() and not mixed[1].learning_problems()
    assert learn.seeds_verdict(mixed) is None
    flat = runs([0.31, 0.32, 0.33])
    for run in flat:
        run.probe_merged = run.probe_initial + 0.05
    assert learn.seeds_verdict(flat) == (
        "the learning run (seeds 0, 1, 2) failed: reward did not rise: per question (first group -> last, paired), "
        "mean over 3 seeds +0.020 (seed 0: +0.010, 1: +0.020, 2: +0.030) (needs +0.05); probe did not move: mean "
        "over 3 seeds +0.050 (seed 0: +0.050, 1: +0.050, 2: +0.050) (needs +0.10)"
    )
    # a check that holds whatever the sampling drew fails the seed it failed on, whatever the mean
    mixed[1].weight_change = 0.0
    assert learn.seeds_verdict(mixed) == (
        "the learning run (seed 1) failed: the merged weights equal the initial weights"
    )
    assert "is not judged" in (learn.seeds_verdict(runs([0.4, 0.4])) or "")
    # sync: each seed passes every check on its own
    assert learn.seeds_verdict(runs([0.4, 0.4, 0.4], "sync")) is None
    assert (learn.seeds_verdict(runs([0.4, 0.31, 0.4], "sync")) or "").startswith(
        "the learning run (seed 1) failed: reward did not rise: per question (first epoch -> last, paired)"
    )


def test_the_modes_beside_each_other_are_one_table_and_one_plot():
    """`--beside-sync`: each mode's seeds' mean rise and each seed's, the probe, how many steps trained on stale
    samples (verl's worst staleness above 0), drawn with the per-step curves."""
    from searchrl.trainer.proofs.learn import modes_table, plot_modes

    def runs(end: float, mode: str, stale: float) -> list[LearnRun]:
        out = []
        for seed in range(3):
            run = _learn_run(
                [0.3] * WINDOW + [0.35] * 10 + [end + 0.01 * seed] * WINDOW,
                training__off_policy__trajectory_staleness_worst__max=stale,
            )
            run.seed, run.mode, run.phases = seed, mode, {"train": 100.0 + seed}
            out.append(run)
        return out

    by_mode = {"sync": runs(0.4, "sync", 0.0), "separate_async": runs(0.38, "separate_async", 1.0)}
    table = modes_table(by_mode).splitlines()
    assert table[2] == "| sync | 0, 1, 2 | +0.110 | +0.100, +0.110, +0.120 | +0.300 | 0 of 60 | 101 |"
    assert table[3].startswith(
        "| separate_async | 0, 1, 2 | +0.090 | +0.080, +0.090, +0.100 | +0.300 | 60 of 60 |"
    )
    png = plot_modes(by_mode)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_every_file_of_learn_cpu_lands_where_learn_files_names_it(monkeypatch, tmp_path):
    """`learn` with each seed's run stubbed (no verl): the seeds' runs get the folders `LearnFiles` names, and the
    tables, curves and record land at its paths, the ones tests/trainer/e2e/test_learn_cpu.py reads after a real
    run (seed-N/, seeds.md, reward_curve.png, run.json; sync/ and <mode>/, modes.md, modes_curve.png beside sync)."""
    import searchrl.trainer.proofs.learn as learn
    from searchrl.trainer.proofs.record import read_record

    monkeypatch.setattr(learn, "check_steps", lambda rows, steps, bound=None: [])
    monkeypatch.setattr(learn, "seeds_checks", lambda runs: "checks: (the stubbed runs logged none)")
    given: list[learn.SeedFiles] = []

    def run_learn(files: learn.SeedFiles, *, seed: int, mode: str, **_: object) -> LearnRun:
        given.append(files)
        files.root.mkdir(parents=True)  # run_learn empties and makes its folder
        run = _learn_run([0.3] * WINDOW + [0.35] * 10 + [0.4 + 0.01 * seed] * WINDOW)
        run.seed, run.mode, run.out_dir = seed, mode, files.root
        return run

    monkeypatch.setattr(learn, "run_learn", run_learn)
    out = tmp_path / "learn"
    learn.learn(out, [0], mode="sync", beside_sync=False)
    assert given == [learn.SeedFiles.under(out / "seed-0")]
    assert (
        given[0].steps == out / "seed-0" / "steps.md"
        and given[0].train_log("2 (resumed)").name == "train-2.log"
    )
    assert (out / "seeds.md").read_text().startswith("| seed |")
    assert (out / "reward_curve.png").read_bytes().startswith(b"\x89PNG")
    assert read_record(out)["run"] == "learn-cpu" and read_record(out)["passed"] is True

    given.clear()
    both = tmp_path / "modes"
    learn.learn(both, [0, 1, 2], mode="separate_async", beside_sync=True)
    assert [files.root.relative_to(both).as_posix() for files in given] == [
        *(f"sync/seed-{seed}" for seed in range(3)),
        *(f"separate_async/seed-{seed}" for seed in range(3)),
    ]
    for folder in (both / "sync", both / "separate_async"):
        assert (folder / "seeds.md").is_file() and (folder / "reward_curve.png").is_file()
    assert (both / "modes.md").read_text().startswith("| mode |")
    assert (both / "modes_curve.png").read_bytes().startswith(b"\x89PNG")
    assert read_record(both)["passed"] is True


def test_a_run_whose_groups_stopped_varying_before_the_last_epoch_fails_as_collapsed(monkeypatch):
    """Issue 39 item 6: at lr 3e-2 every group scored alike from step ~15 (no advantage, no gradient), and the
    rise was measured over a window in which nothing was learning any more."""
    import searchrl.trainer.proofs.learn as learn

    monkeypatch.setattr(learn, "check_steps", lambda rows, steps: [])
    rising = [0.3] * WINDOW + [0.4] * 10 + [0.6] * WINDOW
    collapsed = _learn_run(rising)
    late = {step for step in range(21 - WINDOW, 21)}
    collapsed.trajectories = [
        Trajectory(t.step, t.question, t.group, 0.6) if t.step in late else t for t in collapsed.trajectories
    ]
    assert collapsed.last_epoch_varying() == 0.0
    assert collapsed.problems() == [
        f"the policy collapsed: 0.00 of the last epoch's groups scored differently (needs {MIN_VARYING:.2f}; a group "
        "that scores alike has no advantage and no gradient)"
    ]


def test_the_error_line_names_each_failed_check_once():
    problems = [
        "step 2: sync max prob diff 0.002 above 1e-04 (stale)",
        "step 3: sync max prob diff 0.0025 above 1e-04 (stale)",
        "step 4: observation tokens in loss 40 (trained on)",
        "reward did not rise: 0.491 -> 0.497 (needs +0.10)",
    ]
    assert summarize(problems) == (
        "step 2: sync max prob diff 0.002 above 1e-04 (stale) (and 1 more steps); "
        "step 4: observation tokens in loss 40 (trained on); reward did not rise: 0.491 -> 0.497 (needs +0.10)"
    )


# ---- the probe -------------------------------------------------------------------------------------------------


def test_the_probe_gives_the_end_of_turn_token_and_other_special_tokens_no_characters(tmp_path):
    """Issue 39 item 4: `<|im_end|>` ends the turn empty (reward 0) instead of scoring the letters of its name, and
    other special tokens carry no characters. A model whose final norm is zeroed predicts every token alike, so
    the probe is the plain mean of the per-token rewards, checked against that rule exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchrl.trainer.cpu.tiny_model import write_tiny_model
    from searchrl.trainer.proofs.learn import probe_score, token_rewards

    model_dir = write_tiny_model(
        tmp_path / "m", ["Mike and Emma met at the time of the mime."], vocab_size=300
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.norm.weight.zero_()  # hidden state 0: uniform next-token distribution
    model.save_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    answers = ["Mike"]
    rewards = token_rewards(tokenizer, answers)
    eos = tokenizer.eos_token_id
    assert tokenizer.decode([eos]) == "<|im_end|>" and rewards[eos] == 0.0
    specials = [t for t in tokenizer.all_special_ids if t != eos]
    assert specials and all(math.isnan(rewards[t]) for t in specials)
    kept = [r for r in rewards if not math.isnan(r)]
    ids = tokenizer.encode("the time", add_special_tokens=False)
    assert probe_score(model_dir, [(ids, answers)]) == pytest.approx(sum(kept) / len(kept), abs=1e-6)


def test_the_record_holds_the_learned_line_s_figures_and_each_seed():
    import searchrl.trainer.proofs.learn as learn

    rising = [0.3] * WINDOW + [0.4] * 10 + [0.6] * WINDOW
    runs = [_learn_run(rising)]
    figures = learn.learned_figures(runs)
    line = learn.learned_line(runs)
    assert f"{figures['reward_first']:.3f} -> {figures['reward_last']:.3f} ({figures['rise']:+.3f})" in line
    assert f"{figures['questions_rose']} of {figures['questions']} rose" in line
    assert figures["rise"] == pytest.approx(0.3) and figures["questions"] == WINDOW * 2
    assert figures["seeds"] == [
        {
            "seed": 0,
            "mode": "sync",
            "steps": 20,
            "rise": pytest.approx(0.3),
            "probe_initial": 0.30,
            "probe_merged": 0.60,
            "weight_change": 0.2,
            "wall_s": 0,
        }
    ]
    assert figures["checks"] is None  # no sync was matched in these rows: the record says so, not zeros


def test_a_vllm_seed_that_misses_only_the_learning_bars_gets_one_more_seed(monkeypatch, tmp_path):
    """VLLM_SECOND_SEED: on verl's vLLM server (sampling not reproducible) a single sync seed that passed every other
    check but missed the rise or the probe gets one more seed, judged alone on every check; the record keeps the first
    seed's miss. On hf, in an async mode, or when another check failed, no second seed: the run fails as before."""
    import searchrl.trainer.proofs.learn as learn
    from searchrl.trainer.proofs.record import read_record

    monkeypatch.setattr(learn, "check_steps", lambda rows, steps, bound=None: [])
    monkeypatch.setattr(learn, "seeds_checks", lambda runs: "checks: (the stubbed runs logged none)")
    probes = {0: 0.358, 1: 0.602}  # seed 0's probe fell (fresh clone of 2026-12-07), seed 1's rose
    started: list[int] = []

    def run_learn(files: learn.SeedFiles, *, seed: int, mode: str, **_: object) -> LearnRun:
        started.append(seed)
        files.root.mkdir(parents=True)
        run = _learn_run([0.3] * WINDOW + [0.35] * 10 + [0.4] * WINDOW)
        run.seed, run.mode, run.out_dir = seed, mode, files.root
        run.probe_initial, run.probe_merged = 0.404, probes[seed]
        return run

    monkeypatch.setattr(learn, "run_learn", run_learn)
    runs = learn.learn(tmp_path / "vllm", [0], mode="sync", beside_sync=False, rollout="vllm")
    assert started == [0, 1] and [run.seed for run in runs] == [0, 1]
    record = read_record(tmp_path / "vllm")
    assert record["passed"] and record["figures"]["second_seed_after"].startswith("probe did not move: 0.404")
    assert [seed["seed"] for seed in record["figures"]["seeds"]] == [0, 1]

    probes[1] = 0.40  # the second seed misses too: the run fails, naming both
    started.clear()
    with pytest.raises(
        SmokeCheckError, match=r"seed 0: probe did not move.*; then the learning run \(seed 1\)"
    ):
        learn.learn(tmp_path / "both", [0], mode="sync", beside_sync=False, rollout="vllm")
    assert started == [0, 1] and not read_record(tmp_path / "both")["passed"]

    for rollout in ("hf",):  # the hf engine's sampling is reproducible: one seed, judged alone
        started.clear()
        with pytest.raises(SmokeCheckError, match="probe did not move"):
            learn.learn(tmp_path / rollout, [0], mode="sync", beside_sync=False, rollout=rollout)
        assert started == [0]

    def broken(files: learn.SeedFiles, *, seed: int, mode: str, **_: object) -> LearnRun:
        run = run_learn(files, seed=seed, mode=mode)
        run.weight_change = 0.0  # a check that holds on every honest run
        return run

    monkeypatch.setattr(learn, "run_learn", broken)
    started.clear()
    with pytest.raises(SmokeCheckError, match="merged weights equal"):
        learn.learn(tmp_path / "broken", [0], mode="sync", beside_sync=False, rollout="vllm")
    assert started == [0]
