"""The Python half of `sky/`: validate the task files, find the retrieval endpoint, launch the trainer.

    searchrl sky validate                          # every sky/*.yaml through SkyPilot's own parser
    searchrl sky endpoint searchrl-retrieval       # wait for READY, print http://IP:PORT
    searchrl sky serve --env SEARCHRL_INDEX_BUCKET=my-index --secret RETRIEVAL_API_KEY   # replicas from a bucket
    searchrl sky train --dry-run --env CHECKPOINT_BUCKET=my-ckpts    # print the task, launch nothing
    searchrl sky train --env CHECKPOINT_BUCKET=my-ckpts --secret WANDB_API_KEY

Why this exists (../shared/DESIGN.md section 4): SkyPilot accepts a task whose probe header still says
`$RETRIEVAL_API_KEY` (a secret that was never passed is left as literal text, so the probe 401s forever), cannot
check accelerator names offline, and `sky serve status --endpoint` exits 0 when nothing is up. So we parse every
task with SkyPilot's real parser (`sky.utils.dag_utils.load_chain_dag_from_yaml` with the same env/secret
overrides the CLI applies, `sky.serve.validate_service_task` for services) and add the checks it lacks.

SkyPilot 0.14.1 pins click 8.1.8, which conflicts with huggingface_hub and wandb in the main `.venv`, so it
lives in its own virtual environment `.venv-sky` (`make sky-venv`). `sky` is imported only inside functions;
a `searchrl sky ...` run from an interpreter without it re-runs itself with `.venv-sky/bin/python`
(`run_in_sky_venv`). Secret values travel only through the environment, never argv.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.errors import ConfigError, DeployError

if TYPE_CHECKING:
    import sky

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SKY_DIR = REPO / "sky"
TASK_FILES = ("retrieval.yaml", "index-build.yaml", "train.yaml", "train-single.yaml", "infer.yaml")
SKY_VENV_PYTHON = REPO / ".venv-sky" / "bin" / "python"
SKY_INSTALL_HINT = (
    "SkyPilot is not installed: run `make sky-venv` (python3 -m venv .venv-sky && "
    ".venv-sky/bin/pip install 'skypilot==0.14.1' -e .), or set SEARCHRL_SKY_PYTHON to a python that has it"
)
DEFAULT_SERVICE = "searchrl-retrieval"
DEFAULT_JOB = "searchrl-train"
# How long `searchrl sky endpoint` waits for READY by default: sky/retrieval.yaml's initial_delay_seconds (2000,
# the slowest supported replica start; searchrl/replica_budget.py) plus ~10 min for the controller and provisioning.
ENDPOINT_TIMEOUT_S = 2600.0

# Accelerators we have sized the tasks for (docs/deploy.md). SkyPilot accepts any name offline (its catalog is
# a download), so a typo such as H1000 would only fail at launch time, after the controller is up.
ALLOWED_ACCELERATORS = frozenset({"H100", "H200", "A100-80GB", "A100", "L40S", "L4", "A10G"})

# SkyPilot fills $NAME / ${NAME} in these sections from envs and inline secrets; whatever is left is a bug.
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = "validate-placeholder-{}"  # value given to required (null) envs/secrets while validating
REDACTED = "<redacted>"


# --- where SkyPilot lives ---------------------------------------------------------------------------------------


def sky_importable() -> bool:
    """True if this interpreter can `import sky` (the real package, not the YAML folder `sky/` on sys.path)."""
    spec = importlib.util.find_spec("sky")
    return spec is not None and bool(spec.origin) and str(spec.origin).endswith("__init__.py")


def sky_python() -> str:
    """A python that can import SkyPilot: this one, $SEARCHRL_SKY_PYTHON, or .venv-sky/bin/python."""
    if sky_importable():
        return sys.executable
    explicit = os.environ.get("SEARCHRL_SKY_PYTHON")
    if explicit:
        return explicit
    if SKY_VENV_PYTHON.is_file():
        return str(SKY_VENV_PYTHON)
    raise DeployError(SKY_INSTALL_HINT)


def run_in_sky_venv(argv: Sequence[str]) -> int:
    """Re-run `searchrl <argv>` with the SkyPilot interpreter; secrets stay in the (inherited) environment."""
    python = sky_python()
    log.debug("re-running searchrl %s with %s", argv[:2], python)
    return subprocess.call([python, "-m", "searchrl", *argv], cwd=os.getcwd())


def _sky() -> Any:
    try:
        import sky
    except ImportError as exc:
        raise DeployError(SKY_INSTALL_HINT) from exc
    return sky


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
    (searchrl/index_mount.py; SkyPilot cannot make a file mount optional).
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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeployError(f"{path}: SkyPilot rejected it: {first}") from None
    if len(dag.tasks) != 1:
        raise DeployError(f"{path}: expected one task, found {len(dag.tasks)}")
    task: sky.Task = dag.tasks[0]
    from searchrl.index_mount import BUCKET_ENV, add_index_mount

    declared = any(BUCKET_ENV in (doc.get("envs") or {}) for doc in _raw_docs(path))
    try:
        if declared:  # an --env given to every file by `validate` must not mount the bucket on the trainer
            add_index_mount(task)
    except (ValueError, TypeError) as exc:  # SkyPilot's schema check of the storage spec
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeployError(f"{path}: SkyPilot rejected the index bucket mount: {first}") from None
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


# --- readiness probe --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A readiness probe as SkyServe sends it (sky/serve/replica_managers.py `ReplicaInfo.probe`)."""

    path: str
    post_data: dict[str, Any] | None
    headers: dict[str, str] | None
    timeout_s: float
    initial_delay_s: float

    @property
    def method(self) -> str:
        return "GET" if self.post_data is None else "POST"


def readiness_probe(task: sky.Task) -> Probe:
    spec = task.service
    if spec is None:
        raise DeployError("task has no service: section, so no readiness probe")
    return Probe(
        path=spec.readiness_path,
        post_data=spec.post_data,
        headers=spec.readiness_headers,
        timeout_s=float(spec.readiness_timeout_seconds),
        initial_delay_s=float(spec.initial_delay_seconds),
    )


def send_probe(base_url: str, probe: Probe) -> tuple[int, str]:
    """Send `probe` to `base_url` the way SkyServe does: `requests` with json=post_data, the headers, a timeout."""
    import requests

    url = base_url.rstrip("/") + probe.path
    try:
        if probe.post_data is not None:
            resp = requests.post(url, json=probe.post_data, headers=probe.headers, timeout=probe.timeout_s)
        else:
            resp = requests.get(url, headers=probe.headers, timeout=probe.timeout_s)
    except requests.RequestException as exc:
        raise DeployError(f"probe {probe.method} {url}: unreachable ({type(exc).__name__})") from None
    return resp.status_code, resp.text[:300]


# --- endpoint ---------------------------------------------------------------------------------------------------
# SkyServe 0.14.1 (sky/serve/serve_state.py, serve_utils.set_service_status_and_active_versions_from_replica)
# derives the service status from the READY replicas only: until one replica is READY it reads NO_REPLICA
# (REPLICA_INIT is never set, and failed replicas never make it FAILED). So NO_REPLICA means "starting" and a
# failure is read from each replica's own status in `replica_info`.
_SERVICE_PENDING = frozenset({"CONTROLLER_INIT", "REPLICA_INIT", "NO_REPLICA"})
_SERVICE_TERMINAL = frozenset({"CONTROLLER_FAILED", "FAILED_CLEANUP", "SHUTTING_DOWN", "FAILED"})
# SkyServe 0.14.1's `ReplicaStatus.failed_statuses()`, used when SkyPilot is not importable (tests of the pure
# logic); with SkyPilot the installed package's own list is used. PREEMPTED and NOT_READY are not failures:
# SkyServe replaces a preempted replica, and a NOT_READY one may recover.
_REPLICA_FAILED_0_14_1 = frozenset(
    {"FAILED", "FAILED_CLEANUP", "FAILED_INITIAL_DELAY", "FAILED_PROBING", "FAILED_PROVISION", "UNKNOWN"}
)
# Of those, the ones after which SkyServe's autoscaler stops launching replicas (`ReplicaStatusProperty.
# unrecoverable_failure`: the app failed, or the initial delay ran out, before any replica was READY) and
# FAILED_CLEANUP (a possible leak, never relaunched). The others (FAILED_PROVISION, FAILED_PROBING, UNKNOWN) are
# replaced by a new replica, so the wait goes on until MAX_REPLACED_REPLICAS of them have failed.
_REPLICA_FATAL = frozenset({"FAILED", "FAILED_INITIAL_DELAY", "FAILED_CLEANUP"})
MAX_REPLACED_REPLICAS = 3
_REPLICA_HINT = {
    "FAILED": "its setup or run exited non-zero",
    "FAILED_CLEANUP": "its setup or run failed and the teardown failed too (check the cloud console for leaks)",
    "FAILED_INITIAL_DELAY": "it did not pass the readiness probe within initial_delay_seconds (setup + index "
    "load took longer: raise service.readiness_probe.initial_delay_seconds, docs/deploy.md)",
    "FAILED_PROBING": "it stopped answering the readiness probe",
    "FAILED_PROVISION": "no cloud could provision it (quota, capacity or resources)",
    "UNKNOWN": "SkyServe lost track of it",
}


def service_records(name: str) -> list[dict[str, Any]]:
    """`sky.get(sky.serve.status(name))`: one dict per service with `status`, `endpoint` and `replica_info`."""
    sky = _sky()
    try:
        return list(sky.get(sky.serve.status(name)))
    except Exception as exc:  # the API server may be down or the name unknown; both end the wait
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeployError(
            f"cannot read the status of service {name!r}: {first} (check `sky api status` and `sky check`)"
        ) from None


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status)).upper()


def failed_replica_states() -> frozenset[str]:
    """Replica states SkyServe counts as failed: from the installed SkyPilot when there is one."""
    try:
        from sky.serve.serve_state import ReplicaStatus
    except ImportError:
        return _REPLICA_FAILED_0_14_1
    return frozenset(s.value for s in ReplicaStatus.failed_statuses())


def _replica_states(record: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """(replica_id, STATUS) for every replica SkyServe reports (launched, starting, ready, failed...)."""
    return [
        (info.get("replica_id", "?"), _status_name(info.get("status")))
        for info in record.get("replica_info") or []
    ]


def _summary(replicas: Sequence[tuple[Any, str]]) -> str:
    if not replicas:
        return "no replicas yet"
    counts: dict[str, int] = {}
    for _, status in replicas:
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def wait_for_endpoint(
    name: str,
    *,
    timeout_s: float = ENDPOINT_TIMEOUT_S,
    interval_s: float = 10.0,
    status_fn: Callable[[str], list[dict[str, Any]]] = service_records,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Poll SkyServe until service `name` is READY with an endpoint, and return it as http://IP:PORT.

    Pending while the service reads CONTROLLER_INIT/NO_REPLICA/REPLICA_INIT. A replica in a state after which
    SkyServe stops scaling (FAILED, FAILED_INITIAL_DELAY, FAILED_CLEANUP) ends the wait with one line naming it,
    its state and the command that shows its log; one SkyServe replaces (FAILED_PROVISION, ...) is logged, and
    MAX_REPLACED_REPLICAS of those end it too.
    """
    start = clock()
    deadline = start + timeout_s
    failed_states = failed_replica_states()
    replaced: dict[Any, str] = {}  # replica id -> failed state, for replicas SkyServe replaces
    while True:
        records = status_fn(name)
        if not records:
            raise DeployError(
                f"no service named {name!r}: start it with "
                f"`sky serve up -n {name} sky/retrieval.yaml --secret RETRIEVAL_API_KEY`"
            )
        record = records[0]
        status = _status_name(record.get("status"))
        replicas = _replica_states(record)
        endpoint = record.get("endpoint")
        if status == "READY" and endpoint:
            endpoint = str(endpoint)
            return endpoint if "://" in endpoint else f"http://{endpoint}"
        failed = [(rid, st) for rid, st in replicas if st in failed_states]
        new = [(rid, st) for rid, st in failed if rid not in replaced]
        replaced.update(failed)
        fatal = [(rid, st) for rid, st in failed if st in _REPLICA_FATAL]
        if fatal or len(replaced) >= MAX_REPLACED_REPLICAS:
            rid, st = fatal[0] if fatal else list(replaced.items())[-1]
            count = "" if fatal else f"{len(replaced)} replicas failed, the last: "
            raise DeployError(
                f"service {name!r}: {count}replica {rid} is {st}: {_REPLICA_HINT.get(st, 'it failed')}; its log: "
                f"`sky serve logs {name} {rid}` (controller: `sky serve logs --controller {name}`)"
            )
        for rid, st in new:
            log.warning(
                "service %s: replica %s is %s (%s); SkyServe launches a replacement",
                name,
                rid,
                st,
                _REPLICA_HINT.get(st, "it failed"),
            )
        if status in _SERVICE_TERMINAL or status not in _SERVICE_PENDING | {"READY"}:
            raise DeployError(
                f"service {name!r} is {status} ({_summary(replicas)}): see `sky serve status {name}` and "
                f"`sky serve logs --controller {name}`"
            )
        waited = clock() - start
        if clock() + interval_s > deadline:
            raise DeployError(
                f"service {name!r} not READY after {timeout_s:.0f}s (last status {status}; "
                f"replicas: {_summary(replicas)}); see `sky serve status {name}`"
            )
        log.info(
            "service %s is %s; replicas: %s; waited %.0fs of %.0fs",
            name,
            status,
            _summary(replicas),
            waited,
            timeout_s,
        )
        sleep(interval_s)


# --- the trainer launch -----------------------------------------------------------------------------------------


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

    class BlockDumper(yaml.SafeDumper):
        """Multi-line strings (setup, run) as `|` blocks, so the printed task reads like the file."""

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, _str)
    return BlockDumper


@dataclass
class TrainPlan:
    task: Any  # sky.Task
    text: str  # rendered, redacted
    url: str


def plan_train(
    *,
    envs: Mapping[str, str],
    secret_names: Iterable[str] = (),
    service: str = DEFAULT_SERVICE,
    yaml_path: Path | None = None,
    health_deadline_s: float = 120.0,
    endpoint_timeout_s: float = ENDPOINT_TIMEOUT_S,
    num_nodes: int | None = None,
) -> TrainPlan:
    """Resolve the endpoint, health-check it, and build the task with the overrides and secrets."""
    from searchrl.retrieval.client import check_health

    path = Path(yaml_path or SKY_DIR / "train.yaml")
    envs = dict(envs)
    need_envs, need_secrets = required_names(path)
    secrets = secrets_from_env(sorted(set(need_secrets) | set(secret_names)))
    if not envs.get("RETRIEVAL_SERVICE_URL"):
        envs["RETRIEVAL_SERVICE_URL"] = wait_for_endpoint(service, timeout_s=endpoint_timeout_s)
    missing = [n for n in need_envs if n not in envs]
    if missing:
        raise ConfigError(f"{path.name} needs {' '.join(f'--env {n}=...' for n in missing)}")
    url = envs["RETRIEVAL_SERVICE_URL"]
    for one in [u.strip() for u in url.split(",") if u.strip()]:
        result = check_health(one, secrets.get("RETRIEVAL_API_KEY"), deadline_s=health_deadline_s)
        if not result.ok:
            raise DeployError(
                f"retrieval service {one} failed its health check, not launching: {result.reason}"
            )
        log.info("retrieval service %s: %s", one, result.reason)
    if num_nodes is None and envs.get("NUM_NODES"):
        # `run:` sets NUM_NODES from SKYPILOT_NUM_NODES, so an --env NUM_NODES=4 alone would be overwritten: it
        # means the node count, and the node count is the task's num_nodes (as `sky jobs launch --num-nodes`).
        try:
            num_nodes = int(envs.pop("NUM_NODES"))
        except ValueError:
            raise ConfigError("NUM_NODES must be a whole number of nodes, e.g. --num-nodes 4") from None
    task = load_task(path, envs, secrets)
    # Search-R1 data against a corpus other than wiki-18 trains "search does not help": refuse before launching.
    from searchrl.corpus_check import check_task_corpus

    first_url = [u.strip() for u in url.split(",") if u.strip()][0]
    corpus = check_task_corpus(dict(task.envs), first_url, secrets.get("RETRIEVAL_API_KEY"))
    log.info("retrieval corpus: %s", corpus.describe())
    if num_nodes is not None:
        if num_nodes < 1:
            raise ConfigError(f"--num-nodes must be at least 1, got {num_nodes}")
        task.num_nodes = num_nodes  # as `sky jobs launch --num-nodes`; the trainer reads SKYPILOT_NUM_NODES
    problems = check_task(task)
    if problems:
        raise DeployError(
            f"{path}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return TrainPlan(task=task, text=render_task(task, secrets), url=url)


@dataclass
class ServePlan:
    task: Any  # sky.Task
    text: str  # rendered, redacted
    index_mount: str | None  # where the index bucket is mounted, if any


def plan_serve(
    *,
    envs: Mapping[str, str],
    secret_names: Iterable[str] = (),
    yaml_path: Path | None = None,
    resources: Mapping[str, Any] | None = None,
) -> ServePlan:
    """sky/retrieval.yaml as `searchrl sky serve` launches it: overrides, secrets, the optional index bucket mount.

    `resources` are `sky serve up`'s resource flags (cpus, memory, disk_size, image_id), applied as SkyPilot's
    CLI applies them (`Task.set_resources_override`). Refuses (one line) anything `searchrl sky validate` would
    flag, before a controller or replica starts.
    """
    from searchrl.index_mount import BUCKET_ENV, DEFAULT_MOUNT, MOUNT_ENV

    path = Path(yaml_path or SKY_DIR / "retrieval.yaml")
    _need_envs, need_secrets = required_names(path)
    secrets = secrets_from_env(sorted(set(need_secrets) | set(secret_names)))
    task = load_task(path, envs, secrets)
    if task.service is None:
        raise ConfigError(f"{path} has no service: section; `searchrl sky serve` launches SkyServe services")
    overrides = {k: v for k, v in (resources or {}).items() if v is not None}
    if overrides:
        try:
            task.set_resources_override(overrides)
        except (ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"resources {overrides}: SkyPilot rejected them: {first}") from None
    problems = check_task(task)
    if problems:
        raise DeployError(
            f"{path}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    mount = None
    if (task.envs or {}).get(BUCKET_ENV, "").strip():
        mount = task.envs.get(MOUNT_ENV) or DEFAULT_MOUNT
    return ServePlan(task=task, text=render_task(task, secrets), index_mount=mount)


def launch_serve(plan: ServePlan, *, service_name: str = DEFAULT_SERVICE) -> str:
    """`sky serve up` of the planned task; returns the service name SkyServe gave it."""
    sky = _sky()
    name, _endpoint = sky.stream_and_get(sky.serve.up(plan.task, service_name=service_name))
    return str(name)


def launch_train(plan: TrainPlan, *, job_name: str = DEFAULT_JOB) -> str:
    """Launch the planned task as a managed job (recovers from preemption) and stream its launch log."""
    sky = _sky()
    job_ids, _handle = sky.stream_and_get(sky.jobs.launch(plan.task, name=job_name))
    return ",".join(str(j) for j in (job_ids or []))


__all__ = [
    "ALLOWED_ACCELERATORS",
    "DEFAULT_JOB",
    "DEFAULT_SERVICE",
    "ENDPOINT_TIMEOUT_S",
    "MAX_REPLACED_REPLICAS",
    "Probe",
    "Report",
    "SKY_DIR",
    "ServePlan",
    "TrainPlan",
    "check_task",
    "failed_replica_states",
    "inline_secrets",
    "launch_serve",
    "launch_train",
    "leftover_vars",
    "load_task",
    "parse_env_flags",
    "plan_serve",
    "plan_train",
    "readiness_probe",
    "render_task",
    "required_names",
    "run_in_sky_venv",
    "secrets_from_env",
    "send_probe",
    "service_records",
    "sky_importable",
    "sky_python",
    "task_files",
    "validate_file",
    "validate_files",
    "wait_for_endpoint",
]
