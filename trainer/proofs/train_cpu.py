"""`make train-cpu` / `searchrl train cpu`: verl's real GRPO loop with our search tool, on CPU, in minutes.

The first thing to run before renting GPUs, and what CI runs: every part of a training run that runs without a
GPU (not vLLM/sglang, NCCL or flash-attention), on a model small enough for 2 cores, with nothing downloaded. It
shows that the loop runs; `make learn-cpu` (trainer/proofs/learn.py) shows that it learns.

1. **Retrieval**: `searchrl serve --backend bm25` on the bundled corpus, on a free loopback port.
2. **Model**: a random-weight Qwen2-shaped model and a Qwen2.5-style tokenizer made offline
   (trainer/cpu/tiny_model.py).
3. **Data**: `searchrl train data`'s own prep (trainer/data.py) on a slice of the dev QA set; the tool YAML
   from trainer/toolconfig.py.
4. **Train**: `python -m verl.trainer.main_ppo` with the overrides `searchrl train local` renders for a GPU
   run (trainer/overrides.py), then the CPU ones below: verl's own entry point, `RayPPOTrainer`'s V1 sync
   trainer, its agent loop (`ToolAgentLoop` + our SearchTool), reward workers, TransferQueue, replay buffer
   (our SearchReplayBuffer), FSDP2 actor and reference on gloo, the naive weight sync into the `hf` rollout
   engine (trainer/cpu/hf_rollout.py, registered by trainer/cpu/plugin.py), checkpoints. `--rollout vllm` (`make
   train-cpu ROLLOUT=vllm`): verl's own vLLM server with the GPU run's fingerprint check instead of `hf`
   (trainer/proofs/train_cpu_vllm.py says what differs from a GPU run and why).
   First to `resume_step` (a checkpoint there), then a second invocation that resumes from it to `steps`.
5. **Merge**: `searchrl train merge`'s code (verl's model merger) on the last checkpoint.
6. **Eval**: `searchrl eval` of the merged model with the local HF engine against the same service.

Every step's row (trajectories, model-written and scripted searches, failed searches, reward, advantage, response
length, policy loss, grad norm, rollout/actor sync, observation tokens in the loss, wall time) comes from verl's
own console metrics; `check_steps` fails the run when a row misses what the loop must show (trainer/step_checks.py:
a search on every step, the weight sync within fp32 noise, no tool-response token in the loss), and any failed
step of the flow fails it with one line. The first assistant turn is scripted, as environment with loss mask 0
(trainer/cpu/scripted_agent_loop.py says why); later turns are the random model's own samples. The report ends
with the line that says what the checks read (`step_checks.checks_line`: syncs fingerprinted, the sync figure,
observation and mask counts); a check that never ran fails the run instead.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.devset import dev_qa_path
from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.overrides import hydra_value, merge_overrides
from searchrl.trainer.plugins import versions
from searchrl.trainer.settings import TrainerMode, TrainSettings
from searchrl.trainer.step_checks import (
    StepCheck,
    StepRow,
    async_run_problems,
    async_step_problems,
    check_steps,
    checks_line,
    parse_steps,
    step_summary,
    step_table,
    sync_and_mask_problems,
    sync_matches,
    update_digests,
)

if TYPE_CHECKING:
    from searchrl.trainer.proofs.train_cpu_vllm import Leftovers

log = logging.getLogger(__name__)

EXPERIMENT = "cpu-smoke"
# The first invocation stops after this many steps (verl's total_training_steps), as a preempted job would right
# after its checkpoint; the second resumes from that checkpoint to TrainSettings.total_steps.
RESUME_STEP = 2
STEPS = 3
# The 30-question dev set over the bundled corpus (the repo's copy of ../shared/qa); `--qa` picks another file.
DEV_QA = dev_qa_path()


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
        ("+actor_rollout_ref.rollout.engine_kwargs.hf.scripted_first_turn", scripted_first_turn),
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
# how often the async run's replay buffer polls for finished groups (trainer/plugins/sampler.py: verl polls every 2 s)
ASYNC_POLL_S = 0.1


def check_mode(mode: str) -> None:
    """Refuse a mode the CPU run cannot take, before anything starts."""
    if mode not in MODES:
        raise ConfigError(f"--trainer-mode {mode!r}: the CPU run takes {', '.join(MODES)}")


def async_cpu_overrides(settings: TrainSettings) -> list[str]:
    """The CPU run's own keys in an async mode (verl's mode keys come from the settings, trainer/overrides.py).

    Every version a step's trajectories used must be verified by the hf servers' ledgers; one step's sequences
    per generate, so the next step's run in a batch of their own, which the update after this step aborts and
    verl's async client resumes on the new weights (a spanning trajectory; in one batch of both steps they would
    all finish before the update); and the buffer polls for finished groups every ASYNC_POLL_S, not verl's 2 s.
    """
    from searchrl.trainer.plugins.sampler import HF_LEDGER

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
        ("+trainer.v1.sampler.sampler_kwargs.version_ledger", HF_LEDGER),
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
        qa_source=str(out_dir / "qa.jsonl"),
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


def write_qa(out_dir: Path, source: Path, n: int) -> Path:
    """The first `n` questions of the dev QA set as a QA file data prep reads (it names no data_source)."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    path = out_dir / "qa.jsonl"
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
    from searchrl.trainer.cpu.plugin import ENV
    from searchrl.trainer.supervisor import supervise
    from searchrl.trainer.verl_progress import StartupProgress

    progress = StartupProgress()

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
    (verl_progress.UPDATE_LINE, printed before the comparison) has the trainer adapter's match line with the same
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
    """`step_checks.checks_line` of a CPU run (SmokeCheckError when a check never ran), after the hf engine's own
    check that each update it logged was compared (`hf_sync_problems`; `hf=False` for verl's vLLM server)."""
    problems = hf_sync_problems(logs) if hf else []
    if problems:
        raise SmokeCheckError("checks: " + "; ".join(problems))
    return checks_line(rows, logs, error=SmokeCheckError, **kwargs)


@dataclass
class CpuRun:
    """What one `searchrl train cpu` run did: the step rows, phase times, the merged model and the eval, and the
    line that says what its checks read."""

    out_dir: Path
    rows: list[StepRow] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    merged_dir: Path | None = None
    merged_step: int | None = None
    eval_summary: dict[str, Any] = field(default_factory=dict)
    checks: str = ""  # step_checks.checks_line, set once the run's checks passed

    def report(self) -> str:
        lines = [step_table(self.rows), ""]
        lines.append("phase times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in self.phases.items()))
        if self.merged_dir is not None:
            lines.append(f"merged step {self.merged_step}: {self.merged_dir}")
        if self.eval_summary:
            s = self.eval_summary
            lines.append(
                f"eval of the merged model (local HF engine, pipeline check of a random model, NOT a result): "
                f"n {s.get('n')}, search failures {s.get('search_failures')}, LLM errors {s.get('llm_errors')}, "
                f"EM {s.get('em', 0.0):.3f}"
            )
        if self.checks:
            lines.append(self.checks)
        return "\n".join(lines)


def _phase(run: CpuRun, name: str, started: float) -> None:
    run.phases[name] = time.monotonic() - started
    log.info("%s done in %.0f s", name, run.phases[name])


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
    code, text = run_main_ppo(plan.command, log_path, timeout_s, on_step, label, extra_env)
    if code != 0:
        raise SmokeCheckError(f"{label}: verl exited {code}: {first_error(text)} (log: {log_path})")
    return parse_steps(text, label), text


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


def run_cpu_smoke(
    out_dir: Path,
    *,
    qa_source: Path = DEV_QA,
    questions: int = 12,
    timeout_s: float = 1200.0,
    mode: TrainerMode = "sync",
    rollout: str = "hf",
) -> CpuRun:
    """The whole CPU run (module docstring); raises SmokeCheckError with one line on the first miss.

    `rollout="vllm"`: verl's own vLLM server instead of the hf engine (trainer/proofs/train_cpu_vllm.py), in the CPU vLLM
    venv; what it leaves in /dev/shm, /tmp and its scratch folder is removed however the run ends."""
    from searchrl.trainer.proofs.train_cpu_vllm import check_rollout, engine_scratch

    check_mode(mode)
    check_rollout(rollout, mode)
    with engine_scratch(rollout) as vllm:
        return _run_cpu_smoke(out_dir, qa_source, questions, timeout_s, mode, vllm)


def _run_cpu_smoke(
    out_dir: Path,
    qa_source: Path,
    questions: int,
    timeout_s: float,
    mode: TrainerMode,
    vllm: Leftovers | None = None,  # a vLLM run's scratch and leftovers; None for the hf engine
) -> CpuRun:
    from searchrl.retrieval.process import served
    from searchrl.trainer.cpu.tiny_model import write_tiny_model
    from searchrl.trainer.merge import merge_latest
    from searchrl.trainer.proofs.train_cpu_vllm import engine_overrides

    out_dir = out_dir.expanduser().resolve()
    shutil.rmtree(out_dir, ignore_errors=True)  # a CPU run always starts from nothing: its resume is its own
    out_dir.mkdir(parents=True)
    run = CpuRun(out_dir)
    started = time.monotonic()
    if not qa_source.is_file():
        raise ConfigError(
            f"QA file {qa_source} does not exist: pass --qa with a JSONL of question/golden_answers"
        )
    qa = write_qa(out_dir, qa_source, questions)
    model_dir = write_tiny_model(out_dir / "model", tokenizer_texts(qa))
    _phase(run, "model", started)
    with served(["--backend", "bm25"], out_dir / "serve.log") as url:
        steps = STEPS if mode == "sync" else ASYNC_STEPS
        settings = cpu_settings(out_dir, model_dir, url, steps=steps, mode=mode)
        started = time.monotonic()
        overrides, extra_env = engine_overrides(
            merge_overrides(cpu_overrides(), async_cpu_overrides(settings)), settings, vllm
        )
        on_step: StepCheck = (
            sync_and_mask_problems
            if mode == "sync"
            else partial(
                async_step_problems,
                threshold=ASYNC_THRESHOLD,
                weight_push=mode == "separate_async",
            )
        )
        stop_early = [*overrides, f"trainer.total_training_steps={RESUME_STEP}"]
        rows, text_1 = run_training(
            settings, stop_early, out_dir / "train-1.log", "1", timeout_s, on_step, extra_env
        )
        run.rows += rows
        _phase(run, f"train to step {RESUME_STEP}", started)
        started = time.monotonic()
        rows, text_2 = run_training(
            settings, overrides, out_dir / "train-2.log", "2 (resumed)", timeout_s, on_step, extra_env
        )
        run.rows += rows
        _phase(run, f"resume to step {settings.total_steps}", started)
        if mode == "sync":
            problems = check_steps(run.rows, settings.total_steps)
        else:
            problems = check_steps(run.rows, settings.total_steps, max_prob_diff=math.inf)
            # A turn cut by an update is timing, not a guarantee, in either mode: the CI rehearsal of 2026-11-27 (2
            # cores, three other jobs) trained 12 colocate_async steps without one. The run reports the count
            # (versions/spanning per step); tests/trainer/test_hf_async.py proves the cut-and-resume path itself
            # with verl's own async client.
            problems += async_run_problems(run.rows, [text_1, text_2], RESUME_STEP, require_spanning=False)
            spans = sum(row.metrics.get(versions.SPANNING, 0) for row in run.rows)
            log.info("trajectories spanning two weights versions over the run: %d", spans)
        if problems:
            raise SmokeCheckError("the CPU run missed what training must show: " + "; ".join(problems))
        run.checks = run_checks_line(run.rows, [text_1, text_2], hf=vllm is None, async_mode=mode != "sync")
        started = time.monotonic()
        merged = merge_latest(settings.run_dir)
        run.merged_dir, run.merged_step = merged.target_dir, merged.step
        if merged.step != settings.total_steps:
            raise SmokeCheckError(f"merged step {merged.step}, expected the last step {settings.total_steps}")
        _phase(run, "merge", started)
        started = time.monotonic()
        test_qa = out_dir / "test-qa.jsonl"
        _write_test_split(settings.test_file, test_qa)
        run.eval_summary = run_eval(merged.target_dir, url, test_qa, out_dir, settings)
        _phase(run, "eval", started)
    s = run.eval_summary
    if s["n"] < 1 or s["search_failures"] or s["llm_errors"]:
        raise SmokeCheckError(f"eval of the merged model: {s}")
    return run


def _write_test_split(test_parquet: Path, path: Path) -> None:
    """The run's held-out questions (data prep's test split) as a QA file for `searchrl eval`."""
    from searchrl.trainer.data import read_split

    rows = [
        {"question": row.question, "golden_answers": row.answers, "data_source": "dev"}
        for row in read_split(test_parquet)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


__all__ = [
    "ASYNC_THRESHOLD",
    "MODES",
    "CpuRun",
    "cpu_overrides",
    "cpu_settings",
    "first_error",
    "hf_sync_problems",
    "run_checks_line",
    "run_cpu_smoke",
    "run_training",
    "tokenizer_texts",
    "async_cpu_overrides",
    "check_mode",
    "write_qa",
]
