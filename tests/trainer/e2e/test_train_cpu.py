"""`make train-cpu` as a user runs it: verl's own entry point with Ray, TransferQueue, the agent loop, FSDP2 on gloo
and the `hf` rollout engine trains steps that search, resumes, merges and evaluates; and a reward that raises stops
the run (docs/cpu-proofs.md, "First run on CPU"): minutes, not seconds. The run's parts in seconds are
tests/trainer/proofs/test_train_cpu.py."""

from __future__ import annotations

import math
import sys

import pytest

from searchrl.trainer.overrides import merge_overrides
from searchrl.trainer.proofs.record import PASSED, read_record
from searchrl.trainer.proofs.train_cpu import first_error
from searchrl.trainer.step_checks import parse_steps
from tests.trainer.e2e.runs import TRAIN_CPU_TIMEOUT_S


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.cli_run("train-cpu sync")
def test_make_train_cpu_trains_searches_resumes_merges_and_evaluates(train_cpu_runs):
    """What `make train-cpu` runs, as a user runs it: the CLI, its exit code and its printed table (the run goes
    on beside the colocate_async one, tests/trainer/e2e/conftest.py's plan_train_cpu_runs, started with the session)."""
    from tests.trainer.test_checks_line import checks_figures  # it reads this module's STEP_LINE

    out = train_cpu_runs.out("sync")
    proc = train_cpu_runs.result("sync", TRAIN_CPU_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # the figures from the run's record (trainer/proofs/record.py), not from its printed table
    record = read_record(out)
    assert record["run"] == "train-cpu" and record["passed"] and record["verdict"] == PASSED, record
    figures = record["figures"]
    steps = figures["steps"]
    assert [(s["step"], s["run"]) for s in steps] == [(1, "1"), (2, "1"), (3, "2 (resumed)")], steps
    for step in steps:
        assert step["trajectories"] == step["scripted_calls"] == 4 and step["search_failures"] == 0, step
        assert all(
            isinstance(v, float) and math.isfinite(v) for k, v in step.items() if k not in ("step", "run")
        ), step
        assert step["sync_diff"] < 1e-4 and step["obs_in_loss"] == 0, (
            step
        )  # fp32: the rollout ran trained weights
    assert (
        figures["merged_step"] == 3
        and figures["eval"]["search_failures"] == figures["eval"]["llm_errors"] == 0
    )
    assert "merged step 3:" in proc.stdout and "search failures 0, LLM errors 0" in proc.stdout
    # what its checks read: a sync when each invocation starts and after each step (3 + 2), the fp32 bound over
    # every step, tool responses seen and none trained on, the mask invariant; the line people read says the same
    checks = figures["checks"]
    assert checks["syncs"] == 5 and checks["sync_diff"] < 1e-4 and checks["covered"] == 3, checks
    assert checks["observation_tokens_in_loss"] == 0 and checks["observation_tokens_seen"] > 0, checks
    assert checks["mask_outside"] == checks["mask_missing"] == checks["unrecorded"] == 0, checks
    assert proc.stdout.strip().splitlines()[-1].startswith("checks: ")
    printed = checks_figures(proc.stdout)
    assert (printed["syncs"], printed["seen"]) == (checks["syncs"], checks["observation_tokens_seen"])
    # the resumed invocation loaded step 2's checkpoint, and search metrics are in verl's console log
    second = (out / "train-2.log").read_text(errors="replace")
    assert "global_step_2" in second and "search/calls:" in second
    assert (out / "checkpoints" / "cpu-smoke" / "merged" / "global_step_3" / "config.json").is_file()


@pytest.mark.slow
@pytest.mark.live
def test_a_reward_that_raises_stops_the_run(tmp_path):
    """The bug this replaced: verl 0.9.1 catches the reward's SearchFailureRateError in the agent-loop worker
    and, without our sampler, keeps asking for prompts forever. Against a dead service, the run must end with
    the reward's own message, well before its last step."""
    from searchrl.trainer.cpu.tiny_model import write_tiny_model
    from searchrl.trainer.data import prepare_data
    from searchrl.trainer.overrides import render_overrides, verl_command
    from searchrl.trainer.proofs.train_cpu import (
        DEV_QA,
        cpu_overrides,
        cpu_settings,
        run_main_ppo,
        tokenizer_texts,
        write_qa,
    )
    from searchrl.trainer.toolconfig import write_tool_config
    from tests.conftest import free_port

    qa = write_qa(tmp_path, DEV_QA, 12)
    model = write_tiny_model(tmp_path / "model", tokenizer_texts(qa))
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: every search fails with "connect"
    settings = cpu_settings(tmp_path, model, dead, steps=5).model_copy(
        update={"search_failure_window": 10, "retrieval_max_retries": 0}
    )
    data = prepare_data(settings)
    write_tool_config(settings)
    overrides = merge_overrides(render_overrides(settings, data.train_rows), cpu_overrides())
    code, text = run_main_ppo(verl_command(overrides, sys.executable), tmp_path / "train.log", timeout_s=900)
    assert code != 0
    assert first_error(text).startswith("SearchFailureRateError: 100.0% of the last 10 searches failed")
    assert "RolloutFailedError: rollout groups failed" in text
    assert len(parse_steps(text, "1")) < 5
