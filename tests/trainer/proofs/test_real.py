"""The pieces of training with real weights that run in seconds (issue 32): the chat-template check `searchrl
train` runs before a launch, the template reaching verl intact through hydra, and the CPU precision choice.

The 2-step GRPO run with SmolLM2-135M itself is `make train-cpu-real` (minutes; its numbers are in
docs/cpu-proofs.md): the template check there is the same function these tests call.
"""

from __future__ import annotations

import logging
import math

import pytest

from searchrl.chat_template import CHATML_HERMES_TEMPLATE
from searchrl.errors import ConfigError
from searchrl.trainer.cpu.precision import MIN_SPEEDUP, choose_cpu_dtype
from searchrl.trainer.overrides import hydra_value, render_overrides
from searchrl.trainer.plugins.generated_spans import MISSING, OUTSIDE, UNRECORDED
from searchrl.trainer.proofs.real import check_real_steps, precision_overrides
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.step_checks import COLUMNS, PROB_DIFF_MEAN, SYNC_MAX_PROB_DIFF, StepRow
from searchrl.trainer.template_check import check_train_template

# SmolLM2-135M-Instruct's template in essence: ChatML that never looks at `tools`
NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory, offline_tokenizer):
    """Three tokenizer folders: one whose template renders tools, one that drops them, one without ChatML."""
    import copy

    root = tmp_path_factory.mktemp("tok")
    good = copy.deepcopy(offline_tokenizer)
    good.chat_template = CHATML_HERMES_TEMPLATE
    good.save_pretrained(root / "renders-tools")
    drops = copy.deepcopy(offline_tokenizer)
    drops.chat_template = NO_TOOLS_TEMPLATE
    drops.save_pretrained(root / "drops-tools")
    return root


def _settings(model: str, tmp_path, **kw) -> TrainSettings:
    return TrainSettings(_env_file=None, model_name=model, data_dir=tmp_path / "data", **kw)


def test_a_template_that_drops_the_tool_stops_the_launch_with_the_fix(tokenizer_dirs, tmp_path):
    with pytest.raises(ConfigError) as info:
        check_train_template(_settings(str(tokenizer_dirs / "drops-tools"), tmp_path))
    line = str(info.value)
    assert "ignores tools=" in line and "CHAT_TEMPLATE=searchrl" in line and "\n" not in line
    searchrl = _settings(str(tokenizer_dirs / "drops-tools"), tmp_path, chat_template="searchrl")
    assert check_train_template(searchrl) == "searchrl"
    assert check_train_template(_settings(str(tokenizer_dirs / "renders-tools"), tmp_path)) == "model"


def test_an_unreachable_tokenizer_is_said_not_skipped(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.WARNING):
        assert check_train_template(_settings("nobody/no-such-model", tmp_path)) == "unchecked"
    assert "chat template of nobody/no-such-model not checked" in caplog.text


def test_the_repo_template_reaches_verl_byte_for_byte(tmp_path, compose):
    """Hydra takes a backslash literally unless a quote follows it: the Jinja `\\n` escapes must survive."""
    overrides = render_overrides(_settings("Qwen/Qwen2.5-0.5B-Instruct", tmp_path, chat_template="searchrl"))
    cfg = compose(overrides)
    assert cfg.actor_rollout_ref.model.custom_chat_template == CHATML_HERMES_TEMPLATE
    plain = render_overrides(_settings("Qwen/Qwen2.5-0.5B-Instruct", tmp_path))
    assert not any("custom_chat_template" in item for item in plain)


@pytest.mark.parametrize("text", ["a\\nb", "it's", "ends\\", "x\\'y", "\\\\", "plain words"])
def test_hydra_quoting_round_trips(text, compose):
    cfg = compose([f"+searchrl_probe={hydra_value(text)}"])
    assert cfg.searchrl_probe == text


def test_precision_is_fp32_without_native_bf16_and_measured_with_it(tmp_path):
    def timer(speedup):
        return lambda _dir, dtype: 1.0 if dtype == "float32" else 1.0 / speedup

    never = lambda *_: pytest.fail("bf16 must not be timed on a CPU without it")  # noqa: E731
    assert choose_cpu_dtype(tmp_path, flags={"avx2"}, timer=never)[0] == "float32"
    assert choose_cpu_dtype(tmp_path, flags={"avx512_bf16"}, timer=timer(2.0)) == (
        "bfloat16",
        "bf16: a training step measured 2.00x faster than fp32",
    )
    assert choose_cpu_dtype(tmp_path, flags={"amx_bf16"}, timer=timer(MIN_SPEEDUP - 0.1))[0] == "float32"
    with pytest.raises(ConfigError, match="without native BF16"):
        choose_cpu_dtype(tmp_path, "bf16", flags={"avx2"})
    assert choose_cpu_dtype(tmp_path, "fp32", flags={"amx_bf16"}, timer=never)[0] == "float32"


def test_a_bf16_run_computes_in_bf16_everywhere_and_is_held_to_the_mean_bound(compose):
    cfg = compose(precision_overrides("bfloat16"))
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.hf.dtype == "bfloat16"
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert cfg.actor_rollout_ref.ref.fsdp_config.mixed_precision.reduce_dtype == "fp32"
    metrics = {key: 1.0 for _, key, _ in COLUMNS.values()}
    metrics |= {"search/calls": 2.0, "loss/observation_tokens": 40.0, COLUMNS["search_failures"][1]: 0.0}
    metrics |= {COLUMNS["obs_in_loss"][1]: 0.0, COLUMNS["sync_diff"][1]: 0.2, PROB_DIFF_MEAN: 0.002}
    metrics |= {OUTSIDE: 0.0, MISSING: 0.0, UNRECORDED: 0.0}  # the recorded-span mask invariant held
    rows = [StepRow(step, "real", dict(metrics)) for step in (1, 2)]
    assert check_real_steps(rows, "bfloat16") == []  # bf16 rounding: max 0.2, mean 0.002
    assert any(f"above {SYNC_MAX_PROB_DIFF:.0e}" in p for p in check_real_steps(rows, "float32"))
    rows[1].metrics[PROB_DIFF_MEAN] = 0.05  # a stale sync in bf16
    assert any("mean prob diff" in p for p in check_real_steps(rows, "bfloat16"))
    assert math.isfinite(rows[0].get("reward"))


def test_the_real_run_writes_its_record_whether_it_passes_or_stops(tmp_path, monkeypatch):
    """`make train-cpu-real` writes `<out>/run.json` (trainer/proofs/record.py): precision, steps, timings, the
    checks' figures, the rollout's batching and the merged model when it passed; the failing line and what it had
    when a check stopped it. The run's body is replaced here; the run itself takes the real model (minutes)."""
    from searchrl.errors import SmokeCheckError
    from searchrl.trainer.proofs import real
    from searchrl.trainer.proofs.record import read_record
    from searchrl.trainer.step_checks import Checks

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q", "golden_answers": ["a"]}\n')
    row = StepRow(1, "real", {COLUMNS["reward"][1]: 0.25, "timing_s/gen": 12.0})

    def passes(run, *args):
        run.dtype, run.rows, run.batches = "bfloat16", [row], [(8, 400, 10.0), (8, 200, 5.0)]
        run.checked = Checks(3, 0.004, 2, 2, 0.0, 90.0, 0.0, 0.0, 0.0, mean_bound=True)
        run.merged_params = 134_515_008

    monkeypatch.setattr(real, "_run_real", passes)
    run = real.run_real(tmp_path / "ok", model, qa_source=qa)
    record = read_record(run.out_dir)
    assert record["run"] == "train-cpu-real" and record["passed"], record
    figures = record["figures"]
    assert figures["dtype"] == "bfloat16" and figures["chat_template"] == "searchrl"
    (step,) = figures["steps"]
    assert step["reward"] == 0.25 and step["timing_s"]["timing_s/gen"] == 12.0
    assert step["grad_norm"] is None and step["timing_s"]["timing_s/step"] is None  # not measured: null
    assert figures["rollout"] == {"generate_batches": 2, "sequences": 16, "tokens": 600, "tokens_per_s": 40.0}
    assert figures["checks"]["mean_bound"] and figures["merged_params"] == 134_515_008

    def stops(run, *args):
        run.rows = [row]
        raise SmokeCheckError("the real-weights run missed what training must show: step 1: no search call")

    monkeypatch.setattr(real, "_run_real", stops)
    with pytest.raises(SmokeCheckError):
        real.run_real(tmp_path / "stopped", model, qa_source=qa)
    record = read_record(tmp_path / "stopped")
    assert not record["passed"] and record["verdict"].endswith("step 1: no search call")
    assert len(record["figures"]["steps"]) == 1 and record["figures"]["checks"] is None
