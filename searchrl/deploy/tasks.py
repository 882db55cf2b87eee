"""sky/*.yaml as SkyPilot loads them, plus the checks SkyPilot does not make offline.

`load_task` uses SkyPilot's real parser (`sky.utils.dag_utils.load_chain_dag_from_yaml`) with the same env/secret
overrides its CLI applies; `check_task` adds what it lacks: service rules (`sky.serve.validate_service_task`),
`$VAR`s left unexpanded (a secret never passed stays literal text, so a probe header 401s forever), accelerator
names (SkyPilot's catalog is a download), the probe and the port. `render_task` prints a task with secrets redacted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.deploy.skypilot import SKY_DIR, TASK_FILES, _sky
from searchrl.errors import ConfigError, DeployError, first_line

if TYPE_CHECKING:
    import sky

# Accelerators we have sized the tasks for (docs/deploy.md). SkyPilot accepts any name offline (its catalog is
# a download), so a typo such as H1000 would only fail at launch time, after the controller is up.
ALLOWED_ACCELERATORS = frozenset({"H100", "H200", "A100-80GB", "A100", "L40S", "L4", "A10G"})

# SkyPilot fills $NAME / ${NAME} in these sections from envs and inline secrets; whatever is left is a bug.
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = "validate-placeholder-{}"  # value given to required (null) envs/secrets while validating
REDACTED = "<redacted>"


# --- flags ------------------------------------------------------------------------------------------------------


def parse_env_flags(items: Iterable[str]) -> dict[str, str]:
    """`--env K=V` items into a dict (the last one wins, as in `sky launch`)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _NAME.fullmatch(key):
            raise ConfigError(
                f"--env expects NAME=VALUE, got {item.split('=')[0]!r}...; e.g. --env DATASET_SIZE=small"
            )
        out[key] = value
    return out


def secrets_from_env(names: Iterable[str], *, required: bool = True) -> dict[str, str]:
    """Values of the named secrets, read from the environment (a value never appears in argv)."""
    out: dict[str, str] = {}
    for name in names:
        if "=" in name or not _NAME.fullmatch(name):
            raise ConfigError(
                f"--secret takes a NAME only (got {name.split('=')[0]!r}=...): export the value, e.g. "
                f"`export {name.split('=')[0]}=...`, then pass --secret {name.split('=')[0]}"
            )
        value = os.environ.get(name)
        if value:
            out[name] = value
        elif required:
            raise ConfigError(
                f"secret {name} is not set: export {name}=... before running (never pass it as a flag)"
            )
    return out


# --- loading and checking task files ----------------------------------------------------------------------------


def refuse_problems(path: Path, task: sky.Task) -> None:
    """DeployError naming the first of `check_task`'s problems (and how many more), before anything is billed."""
    problems = check_task(task)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DeployError(f"{path}: {problems[0]}{more}")


def task_files(directory: Path = SKY_DIR) -> list[Path]:
    """The shipped task files, in a fixed order; a missing one is a DeployError."""
    paths = [directory / name for name in TASK_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DeployError(f"task file(s) missing: {', '.join(missing)}")
    return paths


def _raw_docs(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(f"{path}: cannot read YAML: {str(exc).splitlines()[0]}") from None
    return [d for d in docs if isinstance(d, dict)]


def required_names(path: Path) -> tuple[list[str], list[str]]:
    """(envs, secrets) declared with a null value: SkyPilot needs them from --env / --secret at launch."""
    envs: list[str] = []
    secrets: list[str] = []
    for doc in _raw_docs(path):
        envs += [str(k) for k, v in (doc.get("envs") or {}).items() if v is None]
        raw = doc.get("secrets") or {}
        if isinstance(raw, dict):
            secrets += [str(k) for k, v in raw.items() if v is None]
    return envs, secrets


def inline_secrets(path: Path) -> list[str]:
    """Names of secrets with a value written in the file itself (it would sit in git and in `sky` logs)."""
    names: list[str] = []
    for doc in _raw_docs(path):
        raw = doc.get("secrets") or {}
        if isinstance(raw, dict):
            names += [str(k) for k, v in raw.items() if v not in (None, "")]
    return names


def load_task(
    path: Path, envs: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> sky.Task:
    """Parse `path` with SkyPilot's own loader, applying --env/--secret overrides exactly as its CLI does.

    Then, as `searchrl sky serve` launches it: a non-empty SEARCHRL_INDEX_BUCKET mounts that bucket read-only
    (searchrl/deploy/index_mount.py; SkyPilot cannot make a file mount optional).
    """
    _sky()
    from sky.utils import dag_utils

    try:
        dag = dag_utils.load_chain_dag_from_yaml(
            str(path),
            env_overrides=list((envs or {}).items()) or None,
            secret_overrides=list((secrets or {}).items()) or None,
        )
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise DeployError(f"{path}: SkyPilot rejected it: {first_line(exc)}") from None
    if len(dag.tasks) != 1:
        raise DeployError(f"{path}: expected one task, found {len(dag.tasks)}")
    task: sky.Task = dag.tasks[0]
    from searchrl.deploy.index_mount import BUCKET_ENV, add_index_mount

    declared = any(BUCKET_ENV in (doc.get("envs") or {}) for doc in _raw_docs(path))
    try:
        if declared:  # an --env given to every file by `validate` must not mount the bucket on the trainer
            add_index_mount(task)
    except (ValueError, TypeError) as exc:  # SkyPilot's schema check of the storage spec
        raise DeployError(f"{path}: SkyPilot rejected the index bucket mount: {first_line(exc)}") from None
    return task


def leftover_vars(task: sky.Task) -> list[str]:
    """`$VAR`s SkyPilot left unexpanded in the sections it substitutes (service, file mounts, workdir)."""
    sections: dict[str, Any] = {}
    if task.service is not None:
        sections["service"] = task.service.to_yaml_config()
    sections["file_mounts"] = task.file_mounts or {}
    sections["storage_mounts"] = {
        dst: [s.name, str(s.source)] for dst, s in (task.storage_mounts or {}).items()
    }
    if isinstance(task.workdir, str):
        sections["workdir"] = task.workdir
    found: list[str] = []
    for section, value in sections.items():
        for name in sorted(set(_VAR.findall(json.dumps(value)))):
            found.append(f"{section}: ${name}")
    return found


def check_task(task: sky.Task) -> list[str]:
    """Problems SkyPilot does not report offline: service rules, leftover $VARs, accelerators, probe, port."""
    sky = _sky()
    problems: list[str] = []
    if task.service is not None:
        try:
            sky.serve.validate_service_task(task, pool=False)
        except (ValueError, RuntimeError) as exc:
            problems.append(f"service rules: {str(exc).strip().splitlines()[0]}")
        problems += _check_probe(task)
    for var in leftover_vars(task):
        name = var.rsplit("$", 1)[1]
        problems.append(
            f"unexpanded {var} (pass --env {name}=... or --secret {name}, or declare it under envs:/secrets:)"
        )
    for resources in task.resources:
        for name in resources.accelerators or {}:
            if name not in ALLOWED_ACCELERATORS:
                problems.append(
                    f"accelerator {name!r} is not on the allow-list ({', '.join(sorted(ALLOWED_ACCELERATORS))})"
                )
    return problems


def _check_probe(task: sky.Task) -> list[str]:
    spec = task.service
    problems: list[str] = []
    if spec.post_data is None:
        problems.append(
            f"readiness probe is a GET of {spec.readiness_path}: probe with a real POST (post_data)"
        )
    delay_env = (task.envs or {}).get("SEARCHRL_PROBE_DELAY_S")
    if delay_env is not None and delay_env != str(spec.initial_delay_seconds):
        problems.append(
            f"SEARCHRL_PROBE_DELAY_S={delay_env} but readiness_probe.initial_delay_seconds is "
            f"{spec.initial_delay_seconds}: setup checks its start budget against the env, so keep them equal"
        )
    port_env = (task.envs or {}).get("SEARCHRL_RETRIEVAL_PORT")
    ports = {str(p) for r in task.resources for p in (r.ports or [])}
    if spec.ports is not None:
        ports = {str(spec.ports)}
    if port_env is not None and ports and port_env not in ports:
        problems.append(
            f"SEARCHRL_RETRIEVAL_PORT={port_env} but the replica port is {', '.join(sorted(ports))}"
        )
    return problems


@dataclass
class Report:
    """The outcome of validating one task file."""

    path: Path
    problems: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)  # what `sky launch` must be given (--env X, --secret Y)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_file(
    path: Path, envs: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> Report:
    """Validate one task as it would look at launch: required envs/secrets not given get placeholders."""
    path = Path(path)
    report = Report(path)
    envs = dict(envs or {})
    secrets = dict(secrets or {})
    try:
        need_envs, need_secrets = required_names(path)
        for name in need_envs:
            if name not in envs:
                report.needs.append(f"--env {name}")
                envs[name] = PLACEHOLDER.format(name.lower().replace("_", "-"))
        for name in need_secrets:
            if name not in secrets:
                report.needs.append(f"--secret {name}")
                secrets[name] = PLACEHOLDER.format("secret")
        task = load_task(path, envs, secrets)
    except DeployError as exc:
        report.problems.append(str(exc).removeprefix(f"{path}: "))
        return report
    for name in inline_secrets(path):
        report.problems.append(
            f"secret {name} has a value in the file: make it null and pass --secret {name}"
        )
    report.problems += check_task(task)
    return report


def validate_files(
    paths: Sequence[Path], envs: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> list[Report]:
    return [validate_file(p, envs, secrets) for p in paths]


def render_task(task: sky.Task, secrets: Mapping[str, str]) -> str:
    """The task as SkyPilot would launch it, as YAML, with every secret value redacted."""
    import yaml
    from sky.task import redact_task_yaml_dict

    config = task.to_yaml_config()
    config.pop("_user_specified_yaml", None)
    redact_task_yaml_dict(config)
    text: str = yaml.dump(config, Dumper=_block_dumper(), sort_keys=False, width=110)
    for value in sorted(secrets.values(), key=len, reverse=True):
        if value:
            text = text.replace(value, REDACTED)  # e.g. a token substituted into a probe header
    return text


def _block_dumper() -> type:
    import yaml

    class BlockDumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no types: SafeDumper is Any
        """Multi-line strings (setup, run) as `|` blocks, so the printed task reads like the file."""

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, _str)
    return BlockDumper
