"""The parts of `make train-cpu` (trainer/proofs/train_cpu.py) in seconds: its step lines read into rows and a table,
a run stopped at the first step that fails its check, a line per phase of verl's start-up, the scripted first turn
verl's hermes parser reads, the sampler stopping at a failed group. The run itself, as a user runs it, is
tests/trainer/e2e/test_train_cpu.py."""

from __future__ import annotations

import math
import sys

import pytest

from searchrl.errors import RolloutFailedError
from searchrl.trainer.cpu.scripted_agent_loop import question_of, scripted_tool_call
from searchrl.trainer.overrides import merge_overrides
from searchrl.trainer.proofs.train_cpu import first_error
from searchrl.trainer.step_checks import COLUMNS, StepRow, check_steps, parse_steps, step_table
from searchrl.trainer.step_lines import LINE_END

# One step line as verl's console logger prints it inside the TaskRunner actor (trimmed), with the end our patch
# gives it (trainer/patches/step_line.py).
STEP_LINE = (
    "\x1b[36m(TaskRunnerV1 pid=6421)\x1b[0m step:2 - search/trajectories:4.0 - search/calls:4.0 - "
    "search/model_calls:0.0 - search/scripted_calls:4.0 - "
    "search/failures:0.0 - actor/pg_loss:0.0 - actor/grad_norm:1.5e-05 - critic/score/mean:0.0 - "
    "critic/advantages/max:0.0 - training/rollout_probs_diff_max:1.2e-09 - loss/observation_tokens:300.0 - "
    "loss/observation_tokens_in_loss:0.0 - loss/mask_outside_generated:0.0 - loss/mask_missing_in_generated:0.0 - "
    "loss/unrecorded_trajectories:0.0 - response_length/mean:375.0 - timing_s/step:7.0 - num_turns/mean:np.float64(4.0)"
    + LINE_END
)


def test_step_lines_become_rows_and_a_table():
    (row,) = parse_steps("noise\n" + STEP_LINE + "\nmore noise", "1")
    assert row.step == 2 and row.run == "1"
    assert row.get("scripted_calls") == 4 and row.get("grad_norm") == pytest.approx(1.5e-5)
    assert row.get("search_calls") == 0  # the table's search column counts only calls the model wrote
    assert row.metrics["num_turns/mean"] == 4.0
    assert "| 2 | 1 | 4 | 0 | 4 | 0 |" in step_table([row])


def test_check_steps_names_every_miss():
    good = parse_steps(STEP_LINE.replace("step:2", "step:1"), "1")[0]
    assert check_steps([good], 1) == []
    no_search = StepRow(1, "1", {**good.metrics, "search/calls": 0.0})
    failed = StepRow(2, "1", {**good.metrics, "search/failures": 2.0, "actor/grad_norm": math.nan})
    problems = "; ".join(check_steps([no_search, failed], 3))
    assert "expected 1..3" in problems and "step 1: no search call" in problems
    assert "step 2: 2 failed searches" in problems and "grad norm is nan" in problems
    # a call the policy wrote badly is the policy's, measured, not a broken run; the service's failures stay fatal
    policy = {**good.metrics, "search/failures": 3.0, "search/failures/bad_arguments": 1.0}
    assert check_steps([StepRow(1, "1", {**policy, "search/failures": 1.0})], 1) == []
    assert check_steps([StepRow(1, "1", policy)], 1) == ["step 1: 2 failed searches"]
    missing = StepRow(1, "1", {"search/calls": 1.0})
    assert "verl logged no" in check_steps([missing], 1)[0]


def _printing(*lines: str, then_sleep_s: float = 600) -> list[str]:
    """A stand-in for verl's entry point: prints these console lines, then trains on (sleeps)."""
    script = "import time\n" + "".join(f"print({line!r}, flush=True)\n" for line in lines)
    return [sys.executable, "-c", script + f"time.sleep({then_sleep_s})"]


def test_a_cpu_run_stops_at_the_first_step_that_fails_its_check(tmp_path, caplog):
    """Each step line is shown as it arrives and checked: a stale sync at step 2 stops verl there (one line naming
    the step), instead of the whole run going on first; a run past its time limit ends 124."""
    import time

    from searchrl.errors import SmokeCheckError
    from searchrl.trainer.proofs.harness import run_main_ppo
    from searchrl.trainer.step_checks import sync_and_mask_problems

    caplog.set_level("INFO", logger="searchrl.trainer.proofs.harness")  # where run_main_ppo logs
    ok, stale = STEP_LINE.replace("step:2", "step:1"), STEP_LINE.replace("1.2e-09", "0.0028")
    started = time.monotonic()
    with pytest.raises(SmokeCheckError) as info:
        run_main_ppo(_printing(ok, stale), tmp_path / "train.log", 120, sync_and_mask_problems, "1")
    assert time.monotonic() - started < 60
    assert str(info.value).startswith(
        "step 2: sync max prob diff 0.0028 above 1e-04 (the rollout did not sample from the weights the "
        "trainer holds); verl stopped at step 2 (invocation 1, log: "
    )
    assert "step 1 (1): mean reward 0.000, response length 375.0" in caplog.text
    assert (tmp_path / "train.log").read_text().count(" step:") == 2
    code, text = run_main_ppo(_printing(ok, then_sleep_s=60), tmp_path / "slow.log", 2, None, "1")
    assert code == 124 and "step:1" in text


# verl 0.9.1's start-up lines as the tiny learning run logged them (Ray's colour codes included), then our hf
# rollout's: a fast batch (the tiny model) and a slow one (real weights on 2 cores)
STARTUP_LINES = [
    "2026-11-27 10:04:35,678\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at "
    "\x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m",
    "\x1b[36m(TaskRunnerV1 pid=9399)\x1b[0m INFO:2026-11-27 10:04:49,379:train and validate dataloader initialized, "
    "train dataset size: 10, val dataset size: 2",
    "\x1b[36m(WorkerDict pid=9599)\x1b[0m Qwen2ForCausalLM contains 148.93K parameters",
    "\x1b[36m(WorkerDict pid=9599)\x1b[0m Qwen2ForCausalLM contains 148.93K parameters",
    "\x1b[36m(TaskRunnerV1 pid=9399)\x1b[0m INFO:2026-11-27 10:04:57,993:actor and ref model engine initialized",
    "\x1b[36m(TaskRunnerV1 pid=9399)\x1b[0m INFO:2026-11-27 10:05:04,595:all initialize finished, ready to fit",
    "\x1b[36m(HFGenerateServer pid=9650)\x1b[0m searchrl-hf-rollout: weight update 1 for step 0: 27 tensors, "
    "fingerprint a9a0ffb49ae5",
    "\x1b[36m(HFGenerateServer pid=9650)\x1b[0m searchrl-hf-rollout: batch of 16 sequences, 2798 new tokens in 1.11 s",
    "\x1b[36m(HFGenerateServer pid=9650)\x1b[0m searchrl-hf-rollout: batch of 8 sequences, 1536 new tokens in 42.50 s",
]


def test_a_cpu_run_shows_a_line_per_phase_of_verls_start_up_before_its_first_step(tmp_path, caplog):
    """`make train-cpu-real` printed nothing for 6 minutes before its first step (issue 39): each start-up phase
    verl logs gets one line as it arrives, once, and a rollout batch only when it is slow."""
    from searchrl.trainer.proofs.harness import run_main_ppo

    caplog.set_level("INFO", logger="searchrl.trainer.proofs.harness")  # where run_main_ppo logs
    ok = STEP_LINE.replace("step:2", "step:1")
    code, _ = run_main_ppo(
        _printing(*STARTUP_LINES, ok, then_sleep_s=0), tmp_path / "train.log", 60, None, "1"
    )
    assert code == 0
    shown = [r.getMessage() for r in caplog.records]
    phases = [m.split(": ", 1)[1].split(" s: ", 1)[1] for m in shown if m.startswith("1: verl +")]
    assert phases == [
        "Ray started",
        "data read: 10 training rows, 2 validation rows",
        "model built: Qwen2ForCausalLM, 148.93K parameters",
        "actor and reference model loaded",
        "workers ready, first rollout starting",
        "rollout server holds the weights (update 1)",
        "rollout batch: 8 sequences, 1536 new tokens in 42 s (36.1 tokens/s)",
    ]
    assert shown.index(next(m for m in shown if m.startswith("step 1 (1)"))) == len(shown) - 1


def test_merge_overrides_replaces_keys_hydra_would_refuse_twice():
    base = ["a.b=1", "+c.d=2", "e=3"]
    assert merge_overrides(base, ["a.b=9", "c.d=8"]) == ["e=3", "a.b=9", "c.d=8"]


def test_first_error_is_the_cause_not_rays_wrapper():
    log = (
        "(WorkerDict) UserWarning: torchtitan engine is not available\n"
        "ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunnerV1.run()\n"
        "searchrl.errors.SearchFailureRateError: 100.0% of the last 10 searches failed (connect x10)\n"
    )
    assert first_error(log).startswith("SearchFailureRateError: 100.0% of the last 10")
    assert first_error("just a line\n") == "just a line"


def test_the_scripted_first_turn_is_a_call_verls_hermes_parser_reads(offline_tokenizer):
    """The CPU engine's first turn must parse as verl parses a model's turn, or no search would ever run."""
    import asyncio

    from verl.experimental.agent_loop.tool_parser import HermesToolParser

    prompt = offline_tokenizer.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Answer the given question. Question: Who directed The Seventh Seal?\n",
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    question = question_of(prompt)
    assert question == "Who directed The Seventh Seal?"
    ids = offline_tokenizer.encode(scripted_tool_call(question), add_special_tokens=False)
    _, calls = asyncio.run(HermesToolParser(offline_tokenizer).extract_tool_calls(ids, None))
    assert [c.name for c in calls] == ["search"]
    assert '"query_list": ["Who directed The Seventh Seal?"]' in calls[0].arguments


def test_the_sampler_stops_at_the_first_failed_group(monkeypatch):
    """verl's agent-loop worker turns a raising reward into a "failure" group status; ours raises on it."""
    import transfer_queue

    from searchrl.trainer.plugins.sampler import SearchReplayBuffer

    buffer = SearchReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
    )
    tags = {"u1": {"is_prompt": True, "status": "finished", "global_steps": 1}}
    monkeypatch.setattr(transfer_queue, "kv_list", lambda: {"train": tags})
    buffer._sync_metadata_from_transfer_queue()  # all finished: nothing to say
    tags["u2"] = {"is_prompt": True, "status": "failure", "global_steps": 1}
    with pytest.raises(RolloutFailedError, match=r"rollout groups failed \(1 in train\)"):
        buffer._sync_metadata_from_transfer_queue()


def test_the_run_writes_its_record_whether_it_passes_or_stops(tmp_path, monkeypatch):
    """`make train-cpu` writes `<out>/run.json` (trainer/proofs/record.py): the steps under the table's column names,
    the checks' figures, the merged step and the eval's counts when it passed; the failing line and the steps it
    logged when a check stopped it. The run's body is replaced here; tests/trainer/e2e/test_train_cpu.py reads the
    record of the real run."""
    from searchrl.errors import SmokeCheckError
    from searchrl.trainer.proofs import train_cpu
    from searchrl.trainer.proofs.record import read_record
    from searchrl.trainer.step_checks import Checks

    (row,) = parse_steps(STEP_LINE, "1")
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q", "golden_answers": ["a"]}\n')

    def passes(run, *args):
        run.rows.append(row)
        run.checked = Checks(3, 1.2e-9, 3, 3, 0.0, 300.0, 0.0, 0.0, 0.0)
        run.merged_step, run.eval_summary = (
            3,
            {"n": 2, "search_failures": 0, "llm_errors": 0, "em": 0.0, "x": 1},
        )

    monkeypatch.setattr(train_cpu, "_run_cpu_smoke", passes)
    run = train_cpu.run_cpu_smoke(tmp_path / "ok", qa_source=qa)
    record = read_record(run.out_dir)
    assert record["run"] == "train-cpu" and record["passed"] and record["verdict"] == "passed"
    figures = record["figures"]
    assert figures["steps"] == [{"step": 2, "run": "1", **{key: row.get(key) for key in COLUMNS}}]
    assert (
        figures["steps"][0]["sync_diff"] == pytest.approx(1.2e-9) and figures["steps"][0]["mask_outside"] == 0
    )
    assert figures["checks"]["syncs"] == 3 and figures["merged_step"] == 3
    assert figures["eval"] == {"n": 2, "search_failures": 0, "llm_errors": 0, "em": 0.0}
    assert (figures["mode"], figures["rollout"]) == ("sync", "hf")

    def stops(run, *args):
        run.rows.append(row)
        raise SmokeCheckError("the CPU run missed what training must show: step 3: no search call")

    monkeypatch.setattr(train_cpu, "_run_cpu_smoke", stops)
    with pytest.raises(SmokeCheckError):
        train_cpu.run_cpu_smoke(tmp_path / "stopped", qa_source=qa)
    record = read_record(tmp_path / "stopped")
    assert not record["passed"] and record["verdict"].endswith("step 3: no search call")
    assert len(record["figures"]["steps"]) == 1 and record["figures"]["checks"] is None
    assert record["figures"]["merged_step"] is None
