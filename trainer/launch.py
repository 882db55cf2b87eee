"""`make train-local` / `searchrl train local`: train a search agent on this machine's GPUs.

Steps, each of which stops with a one-line `error: ...` when it cannot go on:
  1. GPU check: verl needs NVIDIA GPUs (it ships no CPU rollout; `searchrl train cpu` brings its own for the CPU
     runs); without them we stop before touching anything.
  2. Stack check: the NVIDIA driver is new enough for the CUDA in the lock this environment was installed from
     (trainer/lockfiles.py); with FLASH_ATTN=1 (the default) flash-attn 2's CUDA extension and varlen function import
     (trainer/node/stack_check.py).
  3. Resume check: a run folder that already holds a record must have been started with the same settings
     (RESUME_KEYS); a finished run says so instead of training again. The step verl resumes from has every
     rank's shard (trainer/checkpoint.py), else verl is pointed at the newest complete step (resume_overrides).
  4. Chat template: the model's template must render the search tool (trainer/template_check.py), or CHAT_TEMPLATE=
     searchrl trains with the repo's ChatML/hermes template. Then data: `trainer/data.py` writes (or reuses) <data_dir>/<size>/{train,test}.parquet; the train rows set
     verl's epochs so training reaches TOTAL_STEPS (TrainSettings.epochs_for).
  5. Tool config: `trainer/toolconfig.py` writes the verl tool YAML for the current RETRIEVAL_SERVICE_URL.
  6. Health: a real `POST /retrieve` against every URL; at least one must answer (the rest are failovers).
  7. Corpus: the healthy services' `GET /` must name wiki-18 for Search-R1 data, and not a Flat index over 1M+
     passages searched on CPU (ALLOW_FLAT_INDEX=1 overrides; retrieval/client/corpus_check.py).
  8. Record: the overrides, the resolved settings (no secrets) and the service's corpus checksum and index
     fingerprint go into <run>/searchrl/, like nanoGPT keeps its config inside the checkpoint.
  9. Train: `python -m verl.trainer.main_ppo <overrides>` in the foreground, under the one verl supervisor
     (trainer/supervisor.py); its exit code is ours, except that a step line failing a check (tool responses in
     the loss, a search with no tool-response token seen, verl's rollout/actor limit, a missing check metric) stops
     verl there with one line, and weights the rollout does not hold as sent fail inside verl at the sync
     (ROLLOUT=vllm: the workers' fingerprint, trainer/weight_sync/vllm_sync.py; ROLLOUT=sglang: a block of every
     tensor read back by name, trainer/weight_sync/sglang_sync.py). SMOKE=1 then checks the run
     (trainer/smoke_checks.py): a search happened, a checkpoint was written, merged, and loads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, RetrievalUnavailableError, ServiceUnavailableError
from searchrl.retrieval.client.corpus_check import (
    CorpusIdentity,
    check_index_speed,
    check_training_corpus,
    corpus_identity,
    fetch_service_info,
)
from searchrl.trainer.checkpoint import RECORD_DIR, STEPS_LOG
from searchrl.trainer.checkpoint import check_resume as check_checkpoint
from searchrl.trainer.data import prepare_data
from searchrl.trainer.lockfiles import check_driver, check_driver_for, current_lock, installed_cuda
from searchrl.trainer.merge import TRACKER_FILE
from searchrl.trainer.node.stack_check import StackError, check_flash_attn_2
from searchrl.trainer.overrides import hydra_value, merge_overrides, render_overrides, verl_command
from searchrl.trainer.settings import SEARCH_R1_DATASET, TrainSettings
from searchrl.trainer.step_checks import ProbDiffWatch, StepRow, gpu_step_problems, parse_steps
from searchrl.trainer.supervisor import supervise
from searchrl.trainer.template_check import check_train_template
from searchrl.trainer.toolconfig import write_tool_config
from searchrl.urls import redact_url

log = logging.getLogger(__name__)

# Settings that define a run: resuming a checkpoint under any other value would continue a different run (its
# dataloader position, LR schedule and model shards all depend on them). Everything else may change on resume.
RESUME_KEYS = (
    "model_name",
    "qa_source",
    "dataset_size",
    "seed",
    "train_batch_size",
    "ppo_mini_batch_size",
    "rollout_n",
    "lr",
    "lr_warmup_ratio",
    "kl_coef",
    "kl_loss_type",
    "entropy_coeff",
    "temperature",
    "top_p",
    "total_steps",
    "max_turns",
    "max_prompt_length",
    "max_response_length",
    "topk",
    "passage_max_chars",
    "nnodes",
    "gpus_per_node",
    "rehearse_multi_node",  # FSDP1 shards or FSDP2 HSDP ones: the checkpoint layout changes with it
)


def count_gpus() -> int:
    """Visible CUDA devices (0 with a CPU-only torch or no driver)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of verl
        return 0 if shutil.which("nvidia-smi") is None else -1
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def check_gpus(settings: TrainSettings, found: int | None = None) -> int:
    """Raise ConfigError unless this node has at least GPUS_PER_NODE GPUs."""
    found = count_gpus() if found is None else found
    if found <= 0:
        raise ConfigError(
            "no GPU on this machine: verl training needs NVIDIA GPUs; use a GPU machine or "
            "`searchrl sky train` (data prep, tool config and overrides work here: `searchrl train data|overrides`)"
        )
    if found < settings.gpus_per_node:
        raise ConfigError(
            f"GPUS_PER_NODE is {settings.gpus_per_node} but this machine has {found} GPU(s); set GPUS_PER_NODE={found}"
        )
    return found


def check_stack(settings: TrainSettings, *, nvidia_smi: str = "nvidia-smi") -> str:
    """The driver against the CUDA of the installed torch (installed from the lock; verl's image brings its
    own), else of the lock for this engine and Python; flash-attn 2 itself when FLASH_ATTN is on."""
    cuda = installed_cuda()
    if cuda is not None:
        import torch

        driver = check_driver_for(cuda, f"of the installed torch {torch.__version__}", nvidia_smi=nvidia_smi)
    else:
        lock = current_lock(settings.rollout_name)
        if not lock.is_file():
            raise ConfigError(f"{lock} is missing: run `make lock` (ROLLOUT={settings.rollout_name})")
        driver = check_driver(lock, nvidia_smi=nvidia_smi)
    log.info("NVIDIA driver %s is new enough for CUDA %s", driver, cuda or "in the lock")
    if settings.flash_attn:
        # flash-attn 2 itself (its CUDA extension and varlen function), not any importable `flash_attn`:
        # flash-attn-4's package is one without FA2's kernels (trainer/node/stack_check.py)
        try:
            version = check_flash_attn_2()
        except StackError as exc:
            raise ConfigError(str(exc)) from None
        log.info("flash-attn %s (FA2 CUDA extension and varlen kernels found)", version)
    return driver


@dataclass(frozen=True)
class RunState:
    """What the run folder already holds."""

    step: int | None  # newest finished checkpoint (verl's tracker file), None for a new run
    finished: bool  # that checkpoint is the last step
    merged_dir: Path | None  # <run>/merged/global_step_N when it holds a merged model


def check_resume(settings: TrainSettings) -> RunState:
    """Refuse to resume a run recorded with other settings; report a finished (and maybe merged) run."""
    run_dir = settings.run_dir.expanduser().resolve()
    tracker = run_dir / TRACKER_FILE
    record = run_dir / RECORD_DIR / "settings.json"
    step = None
    if tracker.is_file():
        text = tracker.read_text().strip()
        step = int(text) if text.isdigit() else None
    if record.is_file():
        recorded = json.loads(record.read_text())
        current = settings.redacted_dump()
        differ = [k for k in RESUME_KEYS if k in recorded and recorded[k] != current.get(k)]
        if differ:
            changes = ", ".join(f"{k} {recorded[k]!r} -> {current.get(k)!r}" for k in differ)
            raise ConfigError(
                f"{run_dir} holds a run started with other settings ({changes}); resuming would continue that "
                "run: restore them, or set a new EXPERIMENT_NAME (or leave it empty for the default name)"
            )
    elif step is not None:
        raise ConfigError(
            f"{run_dir} holds checkpoints (step {step}) but no {RECORD_DIR}/settings.json, so resuming cannot "
            "check they belong to this run: set a new EXPERIMENT_NAME"
        )
    finished = step is not None and step >= settings.total_steps
    merged = run_dir / "merged" / f"global_step_{step}"
    return RunState(
        step=step, finished=finished, merged_dir=merged if (merged / "config.json").is_file() else None
    )


def check_retrieval(settings: TrainSettings) -> list[str]:
    """Probe every URL with a real query; return the healthy ones, or raise when none answers."""
    from searchrl.retrieval.client import check_health

    api_key = os.environ.get(settings.retrieval_api_key_env) or None
    healthy, reasons, outages = [], [], 0
    for url in settings.retrieval_urls:
        result = check_health(url, api_key, deadline_s=settings.health_deadline_s)
        log.info("retrieval %s: %s", redact_url(url), result.reason)
        if result.ok:
            healthy.append(url)
        else:
            reasons.append(f"{redact_url(url)}: {result.reason}")
            outages += result.outage
    if not healthy:
        # every URL down (not one refusing) is an outage: exit 75, which a managed job restarts (trainer/node/refusal.py)
        unavailable = ServiceUnavailableError if outages == len(reasons) else RetrievalUnavailableError
        raise unavailable(
            "no retrieval service answers /retrieve (" + "; ".join(reasons) + "); start one with "
            "`searchrl serve` or set RETRIEVAL_SERVICE_URL",
            kind="unhealthy",
        )
    if reasons:
        log.warning(
            "continuing with %d of %d retrieval URLs healthy: %s",
            len(healthy),
            len(reasons) + len(healthy),
            "; ".join(reasons),
        )
    return healthy


def check_corpus(settings: TrainSettings, urls: Sequence[str]) -> CorpusIdentity:
    """Every healthy URL serves the same corpus and index, and it fits the data (retrieval/client/corpus_check.py)."""
    api_key = os.environ.get(settings.retrieval_api_key_env) or None
    seen = [(url, corpus_identity(fetch_service_info(url, api_key))) for url in urls]
    first_url, first = seen[0]
    for url, other in seen[1:]:
        if (other.corpus_checksum, other.index_fingerprint) != (
            first.corpus_checksum,
            first.index_fingerprint,
        ):
            raise ConfigError(
                f"failover URLs serve different indexes ({redact_url(first_url)}: {first.describe()}; "
                f"{redact_url(url)}: {other.describe()}): point RETRIEVAL_SERVICE_URL at replicas of one service"
            )
    check_training_corpus(
        first, search_r1_data=settings.qa_source == SEARCH_R1_DATASET, allow_small=settings.allow_small_corpus
    )
    return check_index_speed(first, allow_flat=settings.allow_flat_index)


def _lock_name(settings: TrainSettings) -> str | None:
    try:
        return current_lock(settings.rollout_name).name
    except ConfigError:  # a Python with no lock (verl's image): the record says so
        return None


def record_run(
    settings: TrainSettings, overrides: Sequence[str], extra: dict[str, Any] | None = None
) -> Path:
    """Write overrides.txt, settings.json (credentials redacted) and run.json (corpus, stack) into <run>/searchrl/."""
    folder = settings.run_dir.expanduser().resolve() / RECORD_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "overrides.txt").write_text("\n".join(overrides) + "\n")
    (folder / "settings.json").write_text(
        json.dumps(settings.redacted_dump(), indent=2, sort_keys=True) + "\n"
    )
    if extra is not None:
        (folder / "run.json").write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n")
    return folder


def _run_trainer(cmd: Sequence[str], steps_log: Path | None) -> int:
    """verl in the foreground under the one supervisor (trainer/supervisor.py), its output passed through; each
    step line is also appended to `steps_log` and checked as it arrives (`gpu_step_problems` with the run's
    `ProbDiffWatch`, seeded with the steps earlier invocations appended, so a resume keeps the run's baseline and
    streak). The first failure stops verl at that step and raises StepCheckError: a GPU run never trains on past
    tool responses in its loss or a check that did not run. A stale rollout is not what stops it here: the mean
    probability difference cannot see one in bf16 (docs/training.md); the weight sync check does, inside verl at the
    sync (hf, vLLM: trainer/weight_sync/vllm_sync.py; sglang, sampled rows of every tensor:
    trainer/weight_sync/sglang_sync.py). The mean over the run is logged in one line when verl ends."""
    log.info("starting verl: %s -m verl.trainer.main_ppo (%d overrides)", cmd[0], len(cmd) - 3)
    watch = ProbDiffWatch()
    if steps_log is not None and steps_log.is_file():
        watch.seed(parse_steps(steps_log.read_text(encoding="utf-8", errors="replace"), "gpu"))

    def step_failures(row: StepRow) -> list[str]:
        failures, warnings = gpu_step_problems(row, watch)
        for problem in warnings:
            log.warning("%s", problem)
        return failures

    try:
        return supervise(
            cmd,
            on_step=step_failures,
            on_line=sys.stdout.write,
            log_path=steps_log,
            log_steps_only=True,
            append=True,
        )
    finally:
        log.info("%s", watch.summary())


def resume_overrides(run_dir: Path, step: int) -> list[str]:
    """Make verl load global_step_`step` rather than the tracker's step (ray_trainer `_load_checkpoint`:
    resume_mode=resume_path takes `resume_from_path`, which must name global_step_N; the tracker is left as it is,
    and verl rewrites it at its next save)."""
    return [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={hydra_value(str(run_dir / f'global_step_{step}'))}",
    ]


@dataclass(frozen=True)
class LaunchPlan:
    command: list[str]  # empty when the run is already finished (nothing to train)
    record_dir: Path | None
    healthy_urls: list[str] = field(default_factory=list)
    state: RunState | None = None
    corpus: CorpusIdentity | None = None


def prepare_launch(
    settings: TrainSettings,
    *,
    gpus: int | None = None,
    nvidia_smi: str = "nvidia-smi",
    extra_overrides: Sequence[str] = (),
    check_device: bool = True,
) -> LaunchPlan:
    """Steps 1-8: everything up to the verl command, which is returned (not run).

    `extra_overrides` replace or add hydra overrides after ours (the CPU run's, trainer/proofs/train_cpu.py), and
    `check_device=False` skips the GPU and driver checks (steps 1-2) for that run; every other step, the resume
    guards included, is the same.
    """
    driver = None
    if check_device:
        check_gpus(settings, gpus)
        driver = check_stack(settings, nvidia_smi=nvidia_smi)
    state = check_resume(settings)
    if state.finished:
        if state.merged_dir is not None:
            raise ConfigError(
                f"{settings.experiment_name} already finished at step {state.step} of {settings.total_steps} and "
                f"is merged in {state.merged_dir}: nothing to do; set a new EXPERIMENT_NAME to train again"
            )
        log.info(
            "%s already finished at step %d of %d: not training again (merge it with `searchrl train merge`)",
            settings.experiment_name,
            state.step,
            settings.total_steps,
        )
        return LaunchPlan(command=[], record_dir=None, state=state)
    resume: list[str] = []
    if state.step is not None:
        # verl's resume_mode=auto loads the step the tracker names: wait until every rank's shard of it is in
        # the bucket; if it never completes, resume from the newest complete step instead, or refuse with one
        # line (no complete step at all) before any GPU work starts.
        run_dir = settings.run_dir.expanduser().resolve()
        step = check_checkpoint(run_dir, deadline_s=settings.checkpoint_wait_s)
        if step is not None and step != state.step:
            resume = resume_overrides(run_dir, step)
        log.info("resuming %s from step %s of %d", settings.experiment_name, step, settings.total_steps)
    template = check_train_template(settings)
    data = prepare_data(settings)
    log.info("data: %d train / %d test rows in %s", data.train_rows, data.test_rows, data.train_file.parent)
    overrides = merge_overrides(render_overrides(settings, data.train_rows), [*resume, *extra_overrides])
    write_tool_config(settings)
    healthy = check_retrieval(settings)
    corpus = check_corpus(settings, healthy)
    record = {
        "corpus": corpus.as_record(),
        "allow_small_corpus": settings.allow_small_corpus,
        "lock": _lock_name(settings),
        "nvidia_driver": driver,
        "chat_template": template,
        "train_rows": data.train_rows,
        "test_rows": data.test_rows,
    }
    record_dir = record_run(settings, overrides, record)
    return LaunchPlan(
        command=verl_command(overrides, sys.executable),
        record_dir=record_dir,
        healthy_urls=healthy,
        state=state,
        corpus=corpus,
    )


def train_local(
    settings: TrainSettings,
    *,
    gpus: int | None = None,
    nvidia_smi: str = "nvidia-smi",
    runner: Callable[[Sequence[str]], int] | None = None,
) -> int:
    """Prepare and run verl in the foreground; return its exit code (SMOKE=1: then check the run).

    Every step line verl prints is kept in <run>/searchrl/steps.log and checked as it arrives: the first step past
    verl's rollout/actor consistency limit, with tool-response tokens in the loss, or missing a check's metric stops
    verl (StepCheckError). SMOKE=1 then checks the finished run (trainer/smoke_checks.py).
    """
    plan = prepare_launch(settings, gpus=gpus, nvidia_smi=nvidia_smi)
    if not plan.command:
        return 0
    steps_log = plan.record_dir / STEPS_LOG if plan.record_dir is not None else None
    code = (runner or (lambda cmd: _run_trainer(cmd, steps_log)))(plan.command)
    if code == 0 and settings.smoke:
        from searchrl.trainer.smoke_checks import check_smoke_run

        report = check_smoke_run(settings)
        log.info("smoke run passed: %s", report.summary())
    return code


__all__ = [
    "RESUME_KEYS",
    "STEPS_LOG",
    "LaunchPlan",
    "RunState",
    "check_corpus",
    "check_gpus",
    "check_resume",
    "check_retrieval",
    "check_stack",
    "count_gpus",
    "prepare_launch",
    "record_run",
    "resume_overrides",
    "train_local",
]
