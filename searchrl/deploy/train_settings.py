"""The TrainSettings the GPU nodes will build, built at plan time from the task alone (`searchrl sky train`).

sky/train.yaml's setup exports NUM_NODES=$SKYPILOT_NUM_NODES and GPUS_PER_NODE=$SKYPILOT_SETUP_NUM_GPUS_PER_NODE
and runs `searchrl train data`, which builds TrainSettings from the task's envs: a combination its validator
refuses (NODES=3: 256 prompts x 5 samples a mini batch do not split over 24 GPUs) used to surface there, after
the install on every node. Here the same class validates the same envs with the task's node count and GPUs per
node before anything is billed, and the launcher's own environment and `.env` are left out (the nodes have
neither). Runs in SkyPilot's venv: TrainSettings needs pydantic-settings only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, ValidationError

from searchrl.errors import ConfigError
from searchrl.trainer.settings import TrainSettings


class _TaskEnvSettings(TrainSettings):
    """TrainSettings from keyword arguments only: no process environment, no `.env` (the nodes have neither)."""

    @classmethod
    def settings_customise_sources(  # type: ignore[override]
        cls, settings_cls: Any, init_settings: Any, **_other_sources: Any
    ) -> tuple[Any, ...]:
        return (init_settings,)


def _kwargs(envs: Mapping[str, str]) -> dict[str, str]:
    """Task envs that set a TrainSettings field, keyed as the class accepts them (alias or field name)."""
    prefix = str(TrainSettings.model_config.get("env_prefix", "")).upper()
    out: dict[str, str] = {}
    for field, info in TrainSettings.model_fields.items():
        alias = info.validation_alias
        names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        names.append(f"{prefix}{field.upper()}")
        for name in names:
            if name in envs and envs[name] is not None:
                out[name if isinstance(alias, AliasChoices) else field] = str(envs[name])
    return out


def node_settings(envs: Mapping[str, str], *, nnodes: int, gpus_per_node: int) -> TrainSettings:
    """TrainSettings as the nodes will build them, or ConfigError (one line) saying what they would refuse."""
    kwargs: dict[str, Any] = {**_kwargs(envs), "nnodes": nnodes, "gpus_per_node": gpus_per_node}
    kwargs.pop("NUM_NODES", None), kwargs.pop("GPUS_PER_NODE", None)  # the task's shape wins, as on the nodes
    try:
        return _TaskEnvSettings(**kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ConfigError(
            f"{nnodes} node(s) x {gpus_per_node} GPUs: the trainer would refuse these settings "
            f"({where + ': ' if where else ''}{msg})"
        ) from None


def task_gpus_per_node(task: Any) -> list[int]:
    """GPUs per node of each resource choice of a sky.Task (what SKYPILOT_SETUP_NUM_GPUS_PER_NODE will be)."""
    counts = set()
    for res in task.resources or []:
        for count in (res.accelerators or {}).values():
            counts.add(int(count))
    return sorted(counts) or [1]


__all__ = ["node_settings", "task_gpus_per_node"]
