"""Which clouds could run a task, decided by SkyPilot's own feasibility code (no launch, no credentials).

SkyPilot drops a cloud silently when it lacks a feature the request needs: `network_tier: best` needs
CUSTOM_NETWORK_TIER (Azure, Lambda, RunPod and an ordinary GPU Kubernetes cluster lack it), more than one node needs
MULTI_NODE (RunPod lacks it), a MOUNT/MOUNT_CACHED bucket needs STORAGE_MOUNTING (RunPod lacks it) and
`resources.autostop` needs AUTODOWN/AUTOSTOP. `check_clouds` asks each cloud the questions SkyPilot asks before
provisioning, in the same order: the task's features (`Task.get_required_cloud_features`, plus autostop as
`sky.execution` adds it), then `Cloud.get_feasible_launchable_resources` (the resources' features, then the
catalog). Catalogs are SkyPilot's CSVs under $SKY_RUNTIME_DIR/.sky/catalogs (downloaded on first use). Runs in
SkyPilot's venv only, like searchrl/deploy/tasks.py; importing this module imports no SkyPilot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sky

NETWORK_TIERS = ("standard", "best")
DEFAULT_NETWORK_TIER = "standard"
# Clouds whose SkyPilot implementation has CUSTOM_NETWORK_TIER (EFA, GPUDirect-TCPX, InfiniBand): `best` only helps
# (and only launches) there.
BEST_TIER_CLOUDS = ("aws", "gcp", "nebius")
# Clouds whose default GPU image carries the NVIDIA 580 driver and CUDA 13 that the locks need (trainer/node/nvidia_driver.py
# refuses anything older), per SkyPilot 0.14.1: AWS `skypilot:custom-gpu-ubuntu-cuda13` (sky/clouds/aws.py
# _DEFAULT_GPU_IMAGE_ID, _get_default_ami), GCP `skypilot:custom-gpu-ubuntu-2204-cuda13` (gcp.py
# _get_gpu_image_id), Nebius image family `ubuntu24.04-cuda13.0` (nebius.py make_deploy_resources_variables).
# Azure's default `skypilot:custom-gpu-ubuntu-v2` has no CUDA 13 variant; Lambda sets no image (its driver is
# Lambda's, not knowable offline); a Kubernetes node's driver is the cluster's. Those need a 580+ driver or an
# image_id, and `searchrl sky train --infra` names them explicitly (docs/deploy.md).
DRIVER_OK_CLOUDS = ("aws", "gcp", "nebius")


@dataclass(frozen=True)
class CloudFit:
    """One cloud's answer: the instance types SkyPilot would consider, or why it would not consider any."""

    cloud: str
    instance_types: tuple[str, ...]
    reason: str = ""  # SkyPilot's own message when there are no candidates

    @property
    def ok(self) -> bool:
        return bool(self.instance_types)


def task_features(task: sky.Task) -> set[Any]:
    """What `sky.execution._execute` requires of a cloud beyond the resources: nodes, mounts, autostop."""
    from sky import clouds

    features = set(task.get_required_cloud_features())
    autostop = next(iter(task.resources)).autostop_config
    if autostop is not None and autostop.enabled and autostop.idle_minutes is not None:
        features.add(
            clouds.CloudImplementationFeatures.AUTODOWN
            if autostop.down
            else clouds.CloudImplementationFeatures.AUTOSTOP
        )
    return features


def check_clouds(task: sky.Task, cloud_names: list[str]) -> list[CloudFit]:
    """Per cloud, the candidates SkyPilot's optimizer would get for `task` (num_nodes included)."""
    import sky as sky_mod  # only ever called where SkyPilot is importable (searchrl/deploy/skypilot.py)
    from sky import exceptions

    fits: list[CloudFit] = []
    for name in cloud_names:
        cloud = sky_mod.CLOUD_REGISTRY.from_str(name)
        if cloud is None:
            fits.append(CloudFit(name, (), f"SkyPilot has no cloud named {name!r}"))
            continue
        types: set[str] = set()
        reasons: list[str] = []
        for resources in task.resources:
            if resources.cloud is not None and not resources.cloud.is_same_cloud(cloud):
                reasons.append(f"the task allows {resources.cloud} only")  # as the optimizer filters
                continue
            candidate = resources.copy(cloud=cloud)
            try:
                cloud.check_features_are_supported(candidate, task_features(task))
            except exceptions.NotSupportedError as exc:
                reasons.append(_one_line(str(exc)))
                continue
            feasible = cloud.get_feasible_launchable_resources(candidate, num_nodes=task.num_nodes)
            types |= {str(r.instance_type) for r in feasible.resources_list}
            if not feasible.resources_list:
                reasons.append(_one_line(feasible.hint or "no instance type in the catalog matches"))
        fits.append(CloudFit(name, tuple(sorted(types)), "" if types else "; ".join(reasons)))
    return fits


def pin_one_cloud(task: sky.Task, infra: str | None = None) -> str:
    """Run the job, and so its checkpoint bucket, in one cloud: `infra` (`--infra aws/us-east-1`), else the first
    cloud the task lists (sky/train.yaml's `ordered`: AWS), else the first of DRIVER_OK_CLOUDS. Returns the cloud.

    Why one: `sky jobs launch` creates a missing bucket on the client, before the optimizer has picked the job's
    cloud (`controller_utils.maybe_translate_local_file_mounts_and_sync_up` -> `Task.sync_storage_mounts` ->
    `Task._get_preferred_store`, which then takes `list(task.resources)[0]`). With several clouds allowed, that is
    whichever entry comes first (of an `any_of` set: any), so a run on another cloud wrote every ~37 GB
    checkpoint across clouds. With one cloud (and region, when `infra` names one), SkyPilot's own rule puts the
    bucket where the job runs. Raises ConfigError when SkyPilot rejects `infra`.
    """
    import sky as sky_mod
    from searchrl.errors import ConfigError

    first = list(task.resources)[0]
    if infra:
        task.set_resources(first.copy(cloud=None, region=None, zone=None))
        try:
            task.set_resources_override({"infra": infra})
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"--infra {infra}: SkyPilot rejected it: {_one_line(str(exc))}") from None
    elif first.cloud is None:
        task.set_resources(first.copy(cloud=sky_mod.CLOUD_REGISTRY.from_str(DRIVER_OK_CLOUDS[0])))
    else:
        task.set_resources(first)
    return str(list(task.resources)[0].cloud).lower()


def set_network_tier(task: sky.Task, tier: str) -> None:
    """Apply `--network-tier` as `sky jobs launch --network-tier` does (`Task.set_resources_override`)."""
    from searchrl.errors import ConfigError

    if tier not in NETWORK_TIERS:
        raise ConfigError(f"network tier must be one of {', '.join(NETWORK_TIERS)}, got {tier!r}")
    task.set_resources_override({"network_tier": tier})


def _one_line(text: str) -> str:
    """SkyPilot's feature table ('Feature  Reason' rows) as one line: 'feature: reason; ...'."""
    rows = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    body = [r for r in rows[1:] if not r.startswith("Feature")]
    if rows and rows[0].startswith("The following features are not supported") and body:
        return "; ".join(f"{r.split(None, 1)[0]}: {' '.join(r.split()[1:])}" for r in body)
    return " ".join(rows)
