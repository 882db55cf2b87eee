"""`make train-local` / `searchrl train local`: train a search agent on this machine's GPUs.

Steps, each of which stops with a one-line `error: ...` when it cannot go on:
  1. GPU check: verl needs NVIDIA GPUs (no CPU rollout exists); without them we stop before touching anything.
  2. Data: `trainer/data.py` writes (or reuses) <data_dir>/<size>/{train,test}.parquet.
  3. Tool config: `trainer/toolconfig.py` writes the verl tool YAML for the current RETRIEVAL_SERVICE_URL.
  4. Health: a real `POST /retrieve` against every URL; at least one must answer (the rest are failovers).
  5. Record: the overrides and the resolved settings (no secrets) go into <run>/searchrl/, like nanoGPT keeps
     its config inside the checkpoint, so a run can be explained and resumed with the same arguments.
  6. Train: `python -m verl.trainer.main_ppo <overrides>` in the foreground; its exit code is ours.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from searchrl.errors import ConfigError, RetrievalUnavailableError
from trainer.checkpoint import check_resume
from trainer.data import prepare_data
from trainer.overrides import main_ppo_command, render_overrides
from trainer.settings import TrainSettings, redact_url
from trainer.toolconfig import write_tool_config

log = logging.getLogger(__name__)

RECORD_DIR = "searchrl"  # inside the run folder, next to verl's global_step_N folders


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


def check_retrieval(settings: TrainSettings) -> list[str]:
    """Probe every URL with a real query; return the healthy ones, or raise when none answers."""
    from retrieval.client import check_health

    api_key = os.environ.get(settings.retrieval_api_key_env) or None
    healthy, reasons = [], []
    for url in settings.retrieval_urls:
        result = check_health(url, api_key, deadline_s=settings.health_deadline_s)
        log.info("retrieval %s: %s", redact_url(url), result.reason)
        if result.ok:
            healthy.append(url)
        else:
            reasons.append(f"{redact_url(url)}: {result.reason}")
    if not healthy:
        raise RetrievalUnavailableError(
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


def record_run(settings: TrainSettings, overrides: Sequence[str]) -> Path:
    """Write overrides.txt and settings.json (credentials redacted) into <run>/searchrl/."""
    folder = settings.run_dir.expanduser().resolve() / RECORD_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "overrides.txt").write_text("\n".join(overrides) + "\n")
    (folder / "settings.json").write_text(
        json.dumps(settings.redacted_dump(), indent=2, sort_keys=True) + "\n"
    )
    return folder


def _run_trainer(cmd: Sequence[str]) -> int:
    log.info("starting verl: %s -m verl.trainer.main_ppo (%d overrides)", cmd[0], len(cmd) - 3)
    return subprocess.run(list(cmd), check=False).returncode


@dataclass(frozen=True)
class LaunchPlan:
    command: list[str]
    record_dir: Path
    healthy_urls: list[str]


def prepare_launch(settings: TrainSettings, *, gpus: int | None = None) -> LaunchPlan:
    """Steps 1-5: everything up to the verl command, which is returned (not run)."""
    check_gpus(settings, gpus)
    # Resume hook (issue 16): verl's resume_mode=auto loads the step the tracker names; wait until every rank's
    # shard of it is in the bucket, or refuse with one line before any GPU work starts.
    check_resume(settings.run_dir.expanduser(), deadline_s=settings.checkpoint_wait_s)
    data = prepare_data(settings)
    log.info("data: %d train / %d test rows in %s", data.train_rows, data.test_rows, data.train_file.parent)
    write_tool_config(settings)
    healthy = check_retrieval(settings)
    overrides = render_overrides(settings)
    record_dir = record_run(settings, overrides)
    return LaunchPlan(
        command=main_ppo_command(settings, sys.executable), record_dir=record_dir, healthy_urls=healthy
    )


def train_local(
    settings: TrainSettings,
    *,
    gpus: int | None = None,
    runner: Callable[[Sequence[str]], int] = _run_trainer,
) -> int:
    """Prepare and run verl in the foreground; return its exit code."""
    plan = prepare_launch(settings, gpus=gpus)
    return runner(plan.command)


__all__ = [
    "LaunchPlan",
    "check_gpus",
    "check_retrieval",
    "count_gpus",
    "prepare_launch",
    "record_run",
    "train_local",
]
