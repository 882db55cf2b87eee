"""The harness of every CPU proof run: settings, overrides, QA, running verl, the checks line, eval.

`make train-cpu` (trainer/proofs/train_cpu.py), `make learn-cpu` (learn.py), the real-weights runs (real.py,
real_learn.py) and `make learn-search` (learn_search.py) are runs built from these parts; each run's module keeps
only what it does and judges (issue 54 item 2: before, train_cpu.py was both this harness and `make train-cpu`).

- **Settings and overrides**: `cpu_settings` (the GPU defaults, small episodes, no environment read), `cpu_overrides`
  (what the CPU changes on top of the GPU run's overrides, each with its reason; DESIGN.md 3b), the async modes' keys.
- **QA**: `write_qa` (a slice of the dev set), `tokenizer_texts` (what the tiny tokenizer is trained on).
- **Running verl**: `run_training` (one invocation through `searchrl train`'s own launch path, each step checked as
  it arrives, stopped at the first problem), `run_main_ppo` underneath, `first_error` for its one-line failure.
- **What the checks read**: `run_checks_line` (`step_checks.checks_line`, after the hf engine's own update count).
- **Eval**: `run_eval`, `searchrl eval` of a merged model, as a user runs it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.devset import dev_qa_path
from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.cpu.hf_log import update_digests
from searchrl.trainer.overrides import hydra_value
from searchrl.trainer.plugins.engine_kwargs import SEARCHRL_KWARGS
from searchrl.trainer.settings import TrainerMode, TrainSettings
from searchrl.trainer.step_checks import (
    Checks,
    StepCheck,
    StepRow,
    checks_made,
    step_summary,
    sync_and_mask_problems,
    sync_matches,
)

log = logging.getLogger(__name__)

EXPERIMENT = "cpu-smoke"
# The first invocation stops after this many steps (verl's total_training_steps), as a preempted job would right
# after its checkpoint; the second resumes from that checkpoint to TrainSettings.total_steps.
RESUME_STEP = 2
STEPS = 3
# The 30-question dev set over the bundled corpus (the repo's copy of ../shared/qa); `--qa` picks another file.
DEV_QA = dev_qa_path()
# A run's slice of it, in the run's folder: `write_qa` writes it, `cpu_settings` points data prep at it
QA_FILE = "qa.jsonl"


# FSDP's mixed-precision policy defaults to bf16 parameters whatever the load dtype (verl/workers/engine/fsdp/
# transformer_impl.py:391-398): the actor and reference would compute in bf16 while the rollout runs fp32, and
# the rollout/actor probability gap at step 1 (5e-5) would hide a stale weight sync (DESIGN.md 3c).
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def cpu_overrides(*, scripted_first_turn: bool = True) -> list[str]:
    """What the CPU run changes on top of the GPU run's overrides (each with its reason; DESIGN.md section 3b)."""
    from searchrl.trainer.cpu.plugin import ENV, ROLLOUT_NAME
    from searchrl.trainer.overrides import VLLM_SYNC_KEY

    pairs: list[tuple[str, object]] = [
        # every Ray process imports the CPU plugin (its environment says so too), not the GPU run's vLLM one
        (VLLM_SYNC_KEY, ENV["VERL_USE_EXTERNAL_MODULES"]),
        # the hf engine (trainer/cpu/hf_rollout.py) instead of vLLM/sglang; one replica on the one "GPU"
        ("actor_rollout_ref.rollout.name", ROLLOUT_NAME),
        (f"+{SEARCHRL_KWARGS}.scripted_first_turn", scripted_first_turn),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),  # default 2 gives 0 replicas on 1 "GPU"
        ("actor_rollout_ref.rollout.agent.num_workers", 1),
        ("reward.num_workers", 1),
        ("data.dataloader_num_workers", 0),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1),  # each unit reserves a CPU
        # Ray: verl's resource pools ask for GPUs whatever the device (trainer/cpu/plugin.py); give it one fake GPU
        ("+ray_kwargs.ray_init.num_gpus", 1),
        ("+ray_kwargs.ray_init.num_cpus", 16),
        ("trainer.device", "cpu"),
        # FSDP2 (fully_shard) runs on a CPU device mesh; FSDP1 resolves device_id 0 as an accelerator
        ("actor_rollout_ref.actor.strategy", "fsdp2"),
        # fp32 end to end, actor, reference and rollout alike: one precision makes the rollout/actor probability
        # difference numerical noise (~1e-9), so a stale weight sync stands out (trainer/step_checks.py)
        ("actor_rollout_ref.actor.fsdp_config.dtype", "float32"),
        ("actor_rollout_ref.ref.fsdp_config.dtype", "float32"),
        ("+actor_rollout_ref.actor.fsdp_config.mixed_precision", FP32),
        ("+actor_rollout_ref.ref.fsdp_config.mixed_precision", FP32),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", False),
    ]
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


# verl's trainer modes the CPU run takes (`--trainer-mode`); separate_async sends weights over the gloo checkpoint
# engine (trainer/cpu/gloo_engine.py) to a standalone hf replica on a second fake Ray GPU (issue 40 item 3)
MODES = ("sync", "colocate_async", "separate_async")
# An async run's staleness bound: verl's ReplayBufferAsync drops a group trained more than this many steps after
# its submission, so a trajectory is at most ASYNC_THRESHOLD - 1 updates behind (trainer/plugins/versions.py). verl's
# default is 8; 2 is the tightest that lets generation run across an update, so the bound is checked, not idle.
ASYNC_THRESHOLD = 2
# The async run trains to step 12 (resuming at 2): the update after a step aborts the turns then generating, which
# are trained a step later; whether any are running at that moment is timing, not a guarantee. In the runs of
# 2026-11-27 about half the chances had one (8 of 15 steps after the first of an invocation; a 3-step run has one
# chance and two of them had none and failed "spans two versions"), so ten chances (steps 2 and 4-12) leave an
# estimated 0.5^10 = 0.1% for a healthy run to fail that check. A step costs ~3 s; start-up is most of the run.
ASYNC_STEPS = 12
# separate_async's weight transfer: the gloo checkpoint engine, registered when verl imports its module
# (rollout.checkpoint_engine.custom_backend_module)
GLOO_ENGINE = "gloo"
GLOO_ENGINE_MODULE = "searchrl.trainer.cpu.gloo_engine"
# separate_async's gloo bucket (MB): verl's default 2048 would be allocated on every sync for a <1 MB model
GLOO_BUCKET_MB = 64
# the async run's replay buffer: ours, checking each used weights version against the hf servers' ledgers
LEDGER_SAMPLER_PATH = "pkg://searchrl.trainer.cpu.ledger_sampler"
LEDGER_SAMPLER_NAME = "HFLedgerReplayBufferAsync"
# how often the async run's replay buffer polls for finished groups (trainer/plugins/sampler.py: verl polls every 2 s)
ASYNC_POLL_S = 0.1


def check_mode(mode: str) -> None:
    """Refuse a mode the CPU run cannot take, before anything starts."""
    if mode not in MODES:
        raise ConfigError(f"--trainer-mode {mode!r}: the CPU run takes {', '.join(MODES)}")


def async_cpu_overrides(settings: TrainSettings) -> list[str]:
    """The CPU run's own keys in an async mode (verl's mode keys come from the settings, trainer/overrides.py).

    Every version a step's trajectories used must be verified by the hf servers' ledgers (verl loads our buffer's
    subclass that reads them, trainer/cpu/ledger_sampler.py); one step's sequences
    per generate, so the next step's run in a batch of their own, which the update after this step aborts and
    verl's async client resumes on the new weights (a spanning trajectory; in one batch of both steps they would
    all finish before the update); and the buffer polls for finished groups every ASYNC_POLL_S, not verl's 2 s.
    """
    if settings.trainer_mode == "sync":
        return []
    pairs: list[tuple[str, object]] = []
    if settings.trainer_mode == "separate_async":
        pairs += [
            # verl's pools ask Ray for GPUs: one fake GPU for the trainer, one for the standalone rollout replica
            ("+ray_kwargs.ray_init.num_gpus", settings.nnodes * settings.gpus_per_node),
            # trainer and rollout now compute at the same time: one thread for the server, not every core
            ("+actor_rollout_ref.rollout.engine_kwargs.hf.threads", 1),
            # the gloo engine's bucket (verl's default 2 GB is allocated per sync): the tiny model is under 1 MB
            ("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", GLOO_BUCKET_MB),
        ]
    pairs += [
        ("trainer.v1.sampler.custom_sampler.path", LEDGER_SAMPLER_PATH),
        ("trainer.v1.sampler.custom_sampler.name", LEDGER_SAMPLER_NAME),
        (
            "+actor_rollout_ref.rollout.engine_kwargs.hf.max_batch",
            settings.train_batch_size * settings.rollout_n,
        ),
        ("+trainer.v1.sampler.sampler_kwargs.poll_interval_s", ASYNC_POLL_S),
    ]
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


def cpu_settings(
    out_dir: Path, model_dir: Path, url: str, *, steps: int = STEPS, mode: TrainerMode = "sync"
) -> TrainSettings:
    """TrainSettings for the CPU run: 2 prompts x 2 samples a step, short episodes, a checkpoint every 2 steps.

    Everything else is the GPU default (GRPO, KL loss 0.001 low_var_kl, hermes tool calls, our reward with its
    failure window), so the run goes through the code paths a GPU run takes. No environment or .env is read:
    the CPU run is the same on every machine. The agent loop is our subclass of verl's ToolAgentLoop whose scripted
    first turn is environment, loss mask 0 (trainer/cpu/scripted_agent_loop.py).
    """
    from searchrl.trainer.cpu.scripted_agent_loop import SCRIPTED_AGENT_NAME

    separate = mode == "separate_async"
    # _env_file: pydantic-settings' init option, outside the fields-only __init__ mypy derives for a model
    return TrainSettings(  # type: ignore[call-arg]
        _env_file=None,
        model_name=str(model_dir),
        qa_source=str(out_dir / QA_FILE),
        dataset_size="small",
        data_dir=out_dir / "data",
        checkpoint_dir=out_dir / "checkpoints",
        experiment_name=EXPERIMENT,
        retrieval_urls=[url],
        agent_loop=SCRIPTED_AGENT_NAME,
        train_batch_size=2,
        # separate_async: mini batch 1, so verl's parameter_sync_step is 2 (two local updates per weight push) and
        # the old-policy path that trainer/patches/old_policy_guard.py guards runs; the other modes update once a step
        ppo_mini_batch_size=1 if separate else 2,
        micro_batch_size_per_gpu=1 if separate else 2,
        rollout_n=2,
        total_steps=steps,
        save_freq=RESUME_STEP,
        test_freq=-1,
        val_before_train=False,
        max_turns=2,
        max_prompt_length=1024,
        max_response_length=384,
        topk=2,
        passage_max_chars=200,
        # separate_async: a trainer "node" and a rollout "node" of one fake GPU each (ROLLOUT_NODES 0 = one)
        nnodes=2 if separate else 1,
        gpus_per_node=1,
        entropy_coeff=0.001,
        lr=1e-4,
        logger="console",
        allow_small_corpus=True,  # the bundled corpus is not wiki-18 (retrieval/corpus_check.py)
        flash_attn=False,  # sdpa: flash-attn is CUDA only (given here, so FLASH_ATTN=1 in the env cannot win)
        health_deadline_s=300.0,
        checkpoint_wait_s=0.0,
        trainer_mode=mode,
        max_off_policy_threshold=ASYNC_THRESHOLD,
        num_warmup_batches=1,  # one batch of prompts in flight before step 1, then one more per step
        checkpoint_engine=GLOO_ENGINE if separate else "nccl",
        checkpoint_engine_module=GLOO_ENGINE_MODULE if separate else None,
    )


def fresh_out_dir(out_dir: Path) -> Path:
    """The run's folder, absolute, emptied and made: a CPU run always starts from nothing (its resume is its own),
    so an earlier run's checkpoints can never be resumed by mistake."""
    out_dir = out_dir.expanduser().resolve()
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    return out_dir


def write_qa(out_dir: Path, source: Path, n: int) -> Path:
    """The first `n` questions of the dev QA set as a QA file data prep reads (it names no data_source)."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    path = out_dir / QA_FILE
    path.write_text(
        "".join(json.dumps({**row, "data_source": "dev"}, ensure_ascii=False) + "\n" for row in rows),
        encoding="utf-8",
    )
    return path


def tokenizer_texts(qa_path: Path) -> list[str]:
    """What the tiny tokenizer is trained on: the template, the tool schema and every prompt of the run."""
    from searchrl.prompt import SEARCH_TOOL_SCHEMA, build_user_prompt
    from searchrl.trainer.cpu.tiny_model import CHATML_HERMES_TEMPLATE

    questions = [json.loads(line)["question"] for line in qa_path.read_text(encoding="utf-8").splitlines()]
    return [CHATML_HERMES_TEMPLATE, json.dumps(SEARCH_TOOL_SCHEMA), *map(build_user_prompt, questions)]


def run_main_ppo(
    command: list[str],
    log_path: Path,
    timeout_s: float,
    on_step: StepCheck | None = None,
    label: str = "",
    extra_env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """verl's trainer under the one verl supervisor (trainer/supervisor.py), the CPU plugin in its environment (Ray
    workers inherit it); its exit code (124 past `timeout_s`) and its log.

    Its output goes to `log_path` as it comes; each phase of verl's start-up and each slow rollout batch gets one
    line (trainer/verl_progress.py), each step line verl prints is shown at once (one short line: a CPU run's
    steps otherwise sit silent in the log for minutes) and handed to `on_step`; the first step with a problem
    stops verl there and raises SmokeCheckError: a broken run costs a start-up and the steps up to the broken one,
    not the whole run.
    """
    from searchrl.trainer.cpu import hf_log
    from searchrl.trainer.cpu.plugin import ENV
    from searchrl.trainer.supervisor import supervise
    from searchrl.trainer.verl_progress import StartupProgress

    # the hf engine's lines mark a phase too (a vLLM run prints none of them)
    progress = StartupProgress(extra_phases=hf_log.PHASES, batch_pattern=hf_log.BATCH_PATTERN)

    def show_phase(line: str) -> None:
        phase = progress.line(line)
        if phase is not None:
            log.info("%s%s", f"{label}: " if label else "", phase)

    def show_and_check(row: StepRow) -> list[str]:
        log.info("%s", step_summary(row))
        return on_step(row) if on_step is not None else []

    code = supervise(
        command,
        on_step=show_and_check,
        on_line=show_phase,
        log_path=log_path,
        env={**ENV, "RAY_DEDUP_LOGS": "0", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})},
        timeout_s=timeout_s,
        label=label,
        error=SmokeCheckError,
    )
    return code, log_path.read_text(encoding="utf-8", errors="replace")


_ERROR_LINE = re.compile(r"\b(\w+(?:Error|Exception)): (.+)$")


def first_error(log_text: str) -> str:
    """The first `SomethingError: message` a verl log names (the cause, not Ray's wrapper), or its last line."""
    for line in log_text.splitlines():
        match = _ERROR_LINE.search(line)
        if match and "RayTaskError" not in match.group(1) and "UserWarning" not in line:
            return f"{match.group(1)}: {match.group(2).strip()}"
    tail = [line for line in log_text.splitlines() if line.strip()]
    return tail[-1].strip() if tail else "no output"


def hf_sync_problems(logs: Sequence[str]) -> list[str]:
    """The hf engine's syncs, invocation by invocation (`logs` in order): every weight update its server logged
    (hf_log.UPDATE_LINE, printed before the comparison) has the trainer adapter's match line with the same
    digest (step_checks.SYNC_MATCH_LINE). An update without one was never compared, and the checks line would
    count fewer syncs than ran."""
    problems = []
    for number, text in enumerate(logs, start=1):
        updated = sorted(digest for _, _, digest in update_digests(text))
        matched = sorted(digest for _, _, digest in sync_matches([text]))
        if updated != matched:
            problems.append(
                f"invocation {number}: the hf server logged {len(updated)} weight updates but the trainer matched "
                f"{len(matched)} fingerprints (updates {updated}, matched {matched}): a sync went unchecked"
            )
    return problems


def run_checks_line(rows: Sequence[StepRow], logs: Sequence[str], *, hf: bool = True, **kwargs: Any) -> str:
    """`step_checks.checks_line` of a CPU run (`run_checks`' line)."""
    return run_checks(rows, logs, hf=hf, **kwargs).line()


def run_checks(rows: Sequence[StepRow], logs: Sequence[str], *, hf: bool = True, **kwargs: Any) -> Checks:
    """What a CPU run's checks read (`step_checks.checks_made`; SmokeCheckError when a check never ran), after the
    hf engine's own check that each update it logged was compared (`hf_sync_problems`; `hf=False` for verl's vLLM
    server)."""
    problems = hf_sync_problems(logs) if hf else []
    if problems:
        raise SmokeCheckError("checks: " + "; ".join(problems))
    return checks_made(rows, logs, error=SmokeCheckError, **kwargs)


def run_training(
    settings: TrainSettings,
    extra: list[str],
    log_path: Path,
    label: str,
    timeout_s: float,
    on_step: StepCheck | None = sync_and_mask_problems,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[StepRow], str]:
    """One verl invocation through `searchrl train`'s own launch path: its step rows and its log.

    `on_step` checks each step as verl logs it (default: the fp32 runs' weight-sync and loss-mask checks) and
    stops the run at the first problem."""
    from searchrl.trainer.launch import prepare_launch

    plan = prepare_launch(settings, extra_overrides=extra, check_device=False)
    if plan.state is not None and plan.state.step is not None:
        log.info("%s: resuming from the checkpoint of step %d", label, plan.state.step)
    rows: list[
        StepRow
    ] = []  # as the supervisor assembled them (trainer/step_lines.py), not re-read from the log

    def collect(row: StepRow) -> list[str]:
        rows.append(row)
        return on_step(row) if on_step is not None else []

    code, text = run_main_ppo(plan.command, log_path, timeout_s, collect, label, extra_env)
    if code != 0:
        raise SmokeCheckError(f"{label}: verl exited {code}: {first_error(text)} (log: {log_path})")
    return rows, text


def run_eval(merged: Path, url: str, qa: Path, out_dir: Path, settings: TrainSettings) -> dict[str, Any]:
    """`searchrl eval` (the CLI a user runs) of the merged model with the local HF engine."""
    results = out_dir / "eval"
    shutil.rmtree(results, ignore_errors=True)
    spec = settings.rollout
    cmd = [
        sys.executable, "-m", "searchrl", "eval", "--engine", "local", "--device", "cpu",
        "--model", str(merged), "--retrieval-url", url, "--qa", str(qa), "--label", "cpu-smoke merged",
        "--max-turns", str(spec.max_turns), "--topk", str(spec.topk),
        "--passage-max-chars", str(spec.passage_max_chars),
        "--max-prompt-tokens", str(spec.max_prompt_tokens),
        "--max-response-tokens", str(spec.max_response_tokens), "--output-dir", str(results),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    (out_dir / "eval.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    found = sorted(results.glob("*.json"))
    if proc.returncode != 0 or not found:
        raise SmokeCheckError(f"searchrl eval exited {proc.returncode}: {first_error(proc.stderr)}")
    doc = json.loads(found[-1].read_text(encoding="utf-8"))
    summary = doc["summary"]
    return {
        "n": len(doc["questions"]),
        "search_failures": int(summary.get("search_failures", 0)),
        "llm_errors": int(summary.get("llm_errors", 0)),
        "em": float(summary.get("em", 0.0)),
        "result": str(found[-1]),
    }
