"""Plan and launch: the retrieval service (`sky serve up`) and the trainer (`sky jobs launch`).

A plan is everything checked before anything is billed: the endpoint found and health-checked, the corpus fits the
data, required envs and secrets given, the task loaded and checked; the printed task has its secrets redacted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.deploy.endpoint import DEFAULT_SERVICE, ENDPOINT_TIMEOUT_S, wait_for_endpoint
from searchrl.deploy.feasibility import DEFAULT_NETWORK_TIER, pin_one_cloud, set_network_tier
from searchrl.deploy.skypilot import SKY_DIR, _sky
from searchrl.deploy.tasks import load_task, refuse_problems, render_task, required_names, secrets_from_env
from searchrl.errors import ConfigError, DeployError, first_line
from searchrl.urls import split_urls

log = logging.getLogger(__name__)

DEFAULT_JOB = "searchrl-train"
# What a dry run puts in RETRIEVAL_SERVICE_URL when none was given: it neither waits for a READY service nor
# health-checks one (a launch does both); the printed task says so.
UNRESOLVED_URL = "http://unresolved-at-dry-run.invalid"


@dataclass
class TrainPlan:
    task: Any  # sky.Task
    text: str  # rendered, redacted
    url: str
    # False: a dry run that left the endpoint (and its health and corpus checks) to the launch
    resolved: bool = True
    # what a step costs with the settings the nodes will build (trainer/step_cost.py plan_lines)
    cost: list[str] = field(default_factory=list)
    # where the job and its checkpoint bucket run, and how to move them (placement_lines)
    placement: list[str] = field(default_factory=list)


def plan_train(
    *,
    envs: Mapping[str, str],
    secret_names: Iterable[str] = (),
    service: str = DEFAULT_SERVICE,
    yaml_path: Path | None = None,
    health_deadline_s: float = 120.0,
    endpoint_timeout_s: float = ENDPOINT_TIMEOUT_S,
    num_nodes: int | None = None,
    network_tier: str = DEFAULT_NETWORK_TIER,
    infra: str | None = None,
    dry_run: bool = False,
) -> TrainPlan:
    """Resolve the endpoint, health-check it, and build the task with the overrides and secrets.

    `network_tier` is `sky jobs launch --network-tier`: `standard` (default) keeps every cloud docs/deploy.md names;
    `best` (EFA/GPUDirect/InfiniBand) leaves only AWS, GCP and Nebius (searchrl/deploy/feasibility.py). `infra`
    (`sky jobs launch --infra aws/us-east-1`) pins the job, and every recovery, where the checkpoint bucket lives;
    without it the job runs in the first of train.yaml's driver-ready clouds (AWS), so that SkyPilot creates the
    bucket in the job's cloud (feasibility.pin_one_cloud).
    A `dry_run` without RETRIEVAL_SERVICE_URL waits for nothing: the task gets UNRESOLVED_URL and no health or
    corpus check runs.
    """
    from searchrl.retrieval.client import check_health

    path = Path(yaml_path or SKY_DIR / "train.yaml")
    envs = dict(envs)
    need_envs, need_secrets = required_names(path)
    secrets = secrets_from_env(sorted(set(need_secrets) | set(secret_names)))
    resolved = True
    if not envs.get("RETRIEVAL_SERVICE_URL"):
        if dry_run:
            envs["RETRIEVAL_SERVICE_URL"] = UNRESOLVED_URL
            resolved = False
        else:
            envs["RETRIEVAL_SERVICE_URL"] = wait_for_endpoint(service, timeout_s=endpoint_timeout_s)
    missing = [n for n in need_envs if n not in envs]
    if missing:
        raise ConfigError(f"{path.name} needs {' '.join(f'--env {n}=...' for n in missing)}")
    url = envs["RETRIEVAL_SERVICE_URL"]
    for one in split_urls(url) if resolved else []:
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
    # service.tls: the certificate the nodes' clients must trust, mounted on every node (searchrl/deploy/tls.py)
    from searchrl.deploy.tls import add_ca_bundle

    add_ca_bundle(task, envs)
    # Search-R1 data against a corpus other than wiki-18 trains "search does not help": refuse before launching.
    from searchrl.retrieval.client.corpus_check import check_task_corpus

    if resolved:
        first_url = split_urls(url)[0]
        corpus = check_task_corpus(dict(task.envs), first_url, secrets.get("RETRIEVAL_API_KEY"))
        log.info("retrieval corpus: %s", corpus.describe())
    if num_nodes is not None:
        if num_nodes < 1:
            raise ConfigError(f"--num-nodes must be at least 1, got {num_nodes}")
        task.num_nodes = num_nodes  # as `sky jobs launch --num-nodes`; the trainer reads SKYPILOT_NUM_NODES
    set_network_tier(task, network_tier)
    # One cloud for the job and its checkpoint bucket (feasibility.pin_one_cloud says why): --infra, else the
    # first of train.yaml's driver-ready clouds.
    cloud = pin_one_cloud(task, infra)
    refuse_problems(path, task)
    cost = step_plan(task)  # a node count the trainer would refuse stops here, with its one line
    placement = placement_lines(cloud, infra, envs.get("CHECKPOINT_BUCKET"))
    return TrainPlan(
        task=task,
        text=render_task(task, secrets),
        url=url,
        resolved=resolved,
        cost=cost,
        placement=placement,
    )


def placement_lines(cloud: str, infra: str | None, bucket: str | None) -> list[str]:
    """What the plan says about where it runs: the cloud it pinned, what that means when the cloud has no
    capacity, and how to move the job (feasibility.pin_one_cloud says why one cloud)."""
    from searchrl.deploy.feasibility import DRIVER_OK_CLOUDS

    where = (
        f"{infra} (--infra)" if infra else f"{cloud} (the first cloud sky/train.yaml lists; --infra moves it)"
    )
    others = [c for c in DRIVER_OK_CLOUDS if c != cloud]
    store = f"the checkpoint bucket {bucket}" if bucket else "the checkpoint bucket"
    return [
        f"cloud: {where}: the job, every recovery and {store} stay in {cloud}",
        f"  without GPU quota or capacity in {cloud} the managed job keeps retrying {cloud} and never tries another "
        "cloud",
        f"  to run elsewhere: --infra {others[0]} (make train INFRA={others[0]}; also "
        f"{', '.join(others[1:]) or 'a region, e.g. aws/us-east-1'}); a bucket that does not exist yet is created "
        "there, one that exists stays where it is",
        "  no list of clouds: SkyPilot 0.14.1 creates the bucket before its optimizer picks the job's cloud, so a "
        "job that moved to a second cloud would write every checkpoint (~37 GB a node) across clouds",
    ]


def step_plan(task: Any) -> list[str]:
    """The nodes' TrainSettings validated here (a node count they would refuse is a ConfigError, one line, before
    anything is billed) and what a step costs with them (trainer/step_cost.py)."""
    from searchrl.deploy.train_settings import node_settings, task_gpus_per_node
    from searchrl.trainer.step_cost import plan_lines

    envs = {k: str(v) for k, v in (task.envs or {}).items() if v is not None}
    nnodes = int(task.num_nodes or 1)
    lines: list[str] = []
    for gpus in task_gpus_per_node(task):
        settings = node_settings(envs, nnodes=nnodes, gpus_per_node=gpus)
        lines += [f"{nnodes} node(s) x {gpus} GPUs:", *(f"  {line}" for line in plan_lines(settings))]
    return lines


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
    from searchrl.deploy.index_mount import BUCKET_ENV, DEFAULT_MOUNT, MOUNT_ENV

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
            raise ConfigError(f"resources {overrides}: SkyPilot rejected them: {first_line(exc)}") from None
    refuse_problems(path, task)
    mount = None
    if (task.envs or {}).get(BUCKET_ENV, "").strip():
        mount = task.envs.get(MOUNT_ENV) or DEFAULT_MOUNT
    return ServePlan(task=task, text=render_task(task, secrets), index_mount=mount)


def launch_serve(plan: ServePlan, *, service_name: str = DEFAULT_SERVICE) -> str:
    """`sky serve up` of the planned task; returns the service name SkyServe gave it."""
    sky = _sky()
    name, _endpoint = sky.stream_and_get(sky.serve.up(plan.task, service_name=service_name))
    return str(name)


def billing_reminder(service: str) -> str:
    """The line `searchrl sky train` ends with: the job's nodes go away by themselves, the service does not."""
    return (
        f"reminder: the retrieval service {service} (its replicas and the serve controller) keeps billing after "
        f"the job ends, until `sky serve down {service}`; the job's GPU nodes are deleted when it ends"
    )


MERGE_YAML = SKY_DIR / "merge.yaml"
MERGE_NOTE = (
    "the managed job runs this task, then sky/merge.yaml on a CPU node: it merges the newest checkpoint into "
    "<run>/merged/global_step_N in the bucket (no GPU waits for it)"
)


def train_pipeline(train_task: Any, *, job_name: str = DEFAULT_JOB) -> Any:
    """The managed job `searchrl sky train` launches: the train task, then sky/merge.yaml on a CPU node.

    A chain of two tasks runs as one managed job (SkyPilot's pipelines): the merge starts only once training
    succeeded, on its own cluster, after the GPU nodes are gone, so no 2 x 8 H100 wait for it. It gets the train
    task's values of the envs it declares (bucket, run name and what names the default run folder).
    """
    sky = _sky()
    need_envs, _ = required_names(MERGE_YAML)
    declared = _sky_envs(MERGE_YAML)
    envs = {name: str(train_task.envs[name]) for name in declared if name in train_task.envs}
    missing = [n for n in need_envs if n not in envs]
    if missing:
        raise ConfigError(f"{MERGE_YAML.name} needs {' '.join(f'--env {n}=...' for n in missing)}")
    merge_task = load_task(MERGE_YAML, envs, {})
    clouds = {str(r.cloud).lower() for r in train_task.resources if r.cloud is not None}
    if len(clouds) == 1:  # the plan pinned the job (and so its bucket) to one cloud: merge next to the bucket
        merge_task.set_resources_override({"infra": clouds.pop()})
    with sky.Dag() as dag:
        dag.add(train_task)
        dag.add(merge_task)
        dag.add_edge(train_task, merge_task)
    dag.name = job_name
    return dag


def _sky_envs(path: Path) -> list[str]:
    """The names under `envs:` in a task file."""
    import yaml

    return list((yaml.safe_load(path.read_text()) or {}).get("envs") or {})


def launch_train(plan: TrainPlan, *, job_name: str = DEFAULT_JOB) -> str:
    """Launch the planned task, then the merge (train_pipeline), as one managed job (recovers from preemption)
    and stream its launch log."""
    sky = _sky()
    job_ids, _handle = sky.stream_and_get(
        sky.jobs.launch(train_pipeline(plan.task, job_name=job_name), name=job_name)
    )
    return ",".join(str(j) for j in (job_ids or []))
