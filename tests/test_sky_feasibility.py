"""Which clouds the train tasks can launch on, decided by SkyPilot 0.14.1's own feasibility code (issue 21 item 1).

`searchrl.deploy.feasibility.check_clouds` asks each cloud what SkyPilot asks before provisioning: the task's
features (`Task.get_required_cloud_features`: nodes, bucket mounts; autostop), then
`Cloud.get_feasible_launchable_resources` (the resources' features, e.g. CUSTOM_NETWORK_TIER for `network_tier:
best`, then the cloud's catalog). Offline, the catalogs are the only stand-in: SkyPilot reads its CSVs from
$SKY_RUNTIME_DIR/.sky/catalogs/v8 and downloads them only when missing, so the test writes one H100:8 row per cloud
in SkyPilot's v8 schema (instance names as SkyPilot's catalog lists them). Kubernetes has no catalog: it asks the
cluster, so two of its methods are replaced by what an ordinary GPU cluster answers (a context whose nodes fit
H100:8, and no high-performance network); everything else is SkyPilot's code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from searchrl.deploy import skypilot
from tests.conftest import REPO
from tests.sky_code import sky_json

CLOUDS = ["aws", "gcp", "azure", "lambda", "nebius", "runpod", "kubernetes"]
GPU = "\"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}\""
HEAD = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice"
CATALOG = {
    "aws/vms.csv": [
        HEAD + ",AvailabilityZone",
        f"p5.48xlarge,H100,8,192,2048,98.32,us-east-1,{GPU},40.0,use1-az1",
    ],
    "gcp/vms.csv": [
        HEAD + ",AvailabilityZone",
        f"a3-highgpu-8g,H100,8,208,1872,88.25,us-central1,{GPU},25.0,us-central1-a",
    ],
    "azure/vms.csv": [HEAD, f"Standard_ND96isr_H100_v5,H100,8,96,1900,98.32,eastus,{GPU},"],
    "lambda/vms.csv": [HEAD, f"gpu_8x_h100_sxm5,H100,8,208,1800,23.92,us-east-1,{GPU},"],
    "nebius/vms.csv": [HEAD, f"gpu-h100-sxm_8gpu-128vcpu-1600gb,H100,8,128,1600,23.60,eu-north1,{GPU},10.00"],
    "runpod/vms.csv": [HEAD + ",AvailabilityZone", f"8x_H100_SECURE,H100,8,128,1000,21.52,US,{GPU},,US-KS-2"],
}

CHECK = r"""
import json, os, sys
from pathlib import Path
from sky import clouds
from searchrl.deploy import feasibility, launch, tasks

# An ordinary GPU Kubernetes cluster: one context whose nodes fit the request, no high-performance network.
clouds.Kubernetes.existing_allowed_contexts = classmethod(lambda cls, silent=False: [])
clouds.Kubernetes.regions_with_offering = classmethod(lambda cls, *a, **k: [clouds.Region("gpu-cluster")])

how, path, tier = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if how.startswith("plan_train"):  # exactly what `searchrl sky train --dry-run` / `make train DRY_RUN=1` builds
    infra = how.partition(":")[2] or None  # plan_train:lambda = `searchrl sky train --infra lambda`
    task = launch.plan_train(envs={"CHECKPOINT_BUCKET": "b"}, yaml_path=path, dry_run=True, network_tier=tier,
                             infra=infra)
    task = task.task
else:
    need_envs, need_secrets = tasks.required_names(path)
    task = tasks.load_task(path, {n: "placeholder" for n in need_envs}, {n: "s" for n in need_secrets})
    if tier != "file":
        feasibility.set_network_tier(task, tier)
fits = feasibility.check_clouds(task, json.loads(sys.argv[4]))
print(json.dumps({f.cloud: {"types": list(f.instance_types), "reason": f.reason} for f in fits}))
"""


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sky-runtime")
    for name, rows in CATALOG.items():
        path = root / ".sky/catalogs/v8" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(rows) + "\n")
    images = "Tag,Region,OS,OSVersion,ImageId,CreationDate\n"
    for name, text in {
        "aws/images.csv": images,
        "gcp/images.csv": images,
        "azure/images.csv": images,
        "aws/instance_quota_mapping.csv": "InstanceType,Region,QuotaCode\n",
        "gcp/accelerator_quota_mapping.csv": "Accelerator,Region,QuotaCode\n",
    }.items():
        (root / ".sky/catalogs/v8" / name).write_text(text)
    return root


def fits(catalogs: Path, how: str, path: Path, tier: str, clouds: list[str] = CLOUDS) -> dict[str, dict]:
    env = {"SKY_RUNTIME_DIR": str(catalogs), "RETRIEVAL_API_KEY": "t"}
    out: dict[str, dict] = sky_json(CHECK, how, str(path), tier, json.dumps(clouds), env=env, timeout=180)
    return out


def test_the_multinode_train_request_has_candidates_on_every_documented_cloud(catalogs: Path) -> None:
    """Without the file's cloud list every documented cloud but RunPod has candidates; `--infra` reaches each."""
    unrestricted = tmp_copy_without_clouds(catalogs)
    got = fits(catalogs, "load", unrestricted, "standard")
    for cloud in ["aws", "gcp", "azure", "lambda", "nebius", "kubernetes"]:
        assert got[cloud]["types"], f"{cloud}: {got[cloud]['reason']}"
    assert got["aws"]["types"] == ["p5.48xlarge"] and got["kubernetes"]["types"] == ["32CPU--128GB--H100:8"]
    # RunPod has no multi-node in SkyPilot (and no bucket mounts): docs/deploy.md says so
    assert not got["runpod"]["types"]
    assert "multi-node: Multi-node not supported" in got["runpod"]["reason"]
    for cloud in ["azure", "lambda", "kubernetes"]:  # `searchrl sky train --infra CLOUD`: the user's choice
        pinned = fits(catalogs, f"plan_train:{cloud}", REPO / "sky/train.yaml", "standard")
        assert sorted(c for c, v in pinned.items() if v["types"]) == [cloud], pinned


def tmp_copy_without_clouds(catalogs: Path) -> Path:
    """sky/train.yaml without its `ordered` cloud list (what the file was before the list moved into it)."""
    text = (REPO / "sky/train.yaml").read_text()
    block = "  ordered:\n    - infra: aws\n    - infra: gcp\n    - infra: nebius\n"
    assert text.count(block) == 1
    path = catalogs / "train-any-cloud.yaml"
    path.write_text(text.replace(block, ""))
    return path


DEFAULT_IMAGES = r"""
import json
from sky import catalog, clouds
from sky.clouds import aws as aws_mod
from sky.clouds import azure as azure_mod
from sky.utils import resources_utils
from searchrl.deploy import feasibility

# The image each cloud's own code picks for an H100:8 node with no image_id (tags, not resolved AMIs: the
# catalog's tag -> id table is a download).
aws_mod.catalog.get_image_id_from_tag = lambda tag, region, clouds=None: tag
images = {
    "aws": clouds.AWS._get_default_ami("us-east-1", "p5.48xlarge"),
    "gcp": clouds.GCP._get_gpu_image_id("H100"),
    "azure": clouds.Azure()._get_default_image_tag("V2", "Standard_ND96isr_H100_v5"),
    "lambda": None if clouds.Lambda._CLOUD_UNSUPPORTED_FEATURES.get(
        clouds.CloudImplementationFeatures.IMAGE_ID) is None else "none: IMAGE_ID unsupported",
}
# Nebius asks its API for the project (credentials): the one call replaced; the image choice is Nebius's own code.
from sky.provision.nebius import utils as nebius_utils
nebius_utils.get_project_by_region = lambda region: "project-e00offline"
r = clouds.Nebius().get_feasible_launchable_resources(
    __import__("sky").Resources(infra="nebius", accelerators="H100:8")).resources_list[0]
images["nebius"] = clouds.Nebius().make_deploy_resources_variables(
    r, resources_utils.ClusterName("c", "c-abcd"), clouds.Region("eu-north1"), None, 2)["image_id"]
print(json.dumps({"images": images, "ok": list(feasibility.DRIVER_OK_CLOUDS)}))
"""


def test_the_default_launch_goes_only_where_the_default_image_has_the_580_driver(catalogs: Path) -> None:
    """Fault 4: Lambda was the cheapest candidate; its node (and Azure's default image) fails the driver check,
    and FAILOVER retried the same cloud into the same refusal. The clouds `searchrl sky train` allows without
    --infra are exactly those whose own default GPU image is the CUDA 13 one."""
    env = {"SKY_RUNTIME_DIR": str(catalogs)}
    got = sky_json(DEFAULT_IMAGES, env=env, timeout=180)
    cuda13 = sorted(c for c, image in got["images"].items() if image and "cuda13" in image)
    assert cuda13 == sorted(got["ok"]) == ["aws", "gcp", "nebius"], got["images"]
    assert got["images"]["azure"] == "skypilot:custom-gpu-ubuntu-v2"
    plan = fits(catalogs, "plan_train", REPO / "sky/train.yaml", "standard")
    # one driver-ready cloud: the one its checkpoint bucket is created in (test_the_checkpoint_bucket_...)
    assert sorted(c for c, v in plan.items() if v["types"]) == ["aws"], plan
    for cloud in ["gcp", "nebius", "azure", "lambda", "kubernetes", "runpod"]:
        assert "the task allows" in plan[cloud]["reason"], plan[cloud]


def test_the_file_itself_asks_for_no_network_tier(catalogs: Path) -> None:
    """The tier is a flag: without the file's cloud list, the clouds that lack `best` keep their candidates."""
    got = fits(catalogs, "load", tmp_copy_without_clouds(catalogs), "file", ["azure", "lambda", "kubernetes"])
    assert all(v["types"] for v in got.values()), got


def test_a_by_hand_launch_of_the_file_goes_only_where_the_default_image_has_the_580_driver(
    catalogs: Path,
) -> None:
    """Trap (issue 38 item 5): `sky jobs launch sky/train.yaml` skipped the plan's cloud restriction, so the
    cheapest candidate (Lambda here, as in fault 4) failed the driver check on every FAILOVER retry. The file
    itself now lists the driver-ready clouds; SkyPilot's own feasibility code drops the rest."""
    got = fits(catalogs, "load", REPO / "sky/train.yaml", "file")
    assert sorted(c for c, v in got.items() if v["types"]) == ["aws", "gcp", "nebius"], got
    for cloud in ["azure", "lambda", "kubernetes", "runpod"]:
        assert "the task allows" in got[cloud]["reason"], got[cloud]
    ok = sky_json(DEFAULT_IMAGES, env={"SKY_RUNTIME_DIR": str(catalogs)}, timeout=180)["ok"]
    assert sorted(ok) == [
        "aws",
        "gcp",
        "nebius",
    ]  # the same list the plan applies (feasibility.DRIVER_OK_CLOUDS)


def test_network_tier_best_keeps_only_aws_gcp_and_nebius(catalogs: Path) -> None:
    """The tier alone (the file with `--network-tier best` applied), apart from the default launch's own choice."""
    got = fits(catalogs, "load", tmp_copy_without_clouds(catalogs), "best")
    assert sorted(c for c, v in got.items() if v["types"]) == ["aws", "gcp", "nebius"]
    for cloud in ["azure", "lambda", "kubernetes"]:
        assert got[cloud]["reason"].startswith("custom_network_tier: Custom network tier is"), got[cloud]


def test_train_single_has_candidates_everywhere_and_runpod_only_lacks_bucket_mounts(
    catalogs: Path, tmp_path: Path
) -> None:
    got = fits(catalogs, "load", REPO / "sky/train-single.yaml", "standard")
    for cloud in ["aws", "gcp", "azure", "lambda", "nebius", "kubernetes"]:
        assert got[cloud]["types"], f"{cloud}: {got[cloud]['reason']}"
    # SkyPilot mounts no bucket on RunPod: the MOUNT_CACHED /checkpoints is the one thing it refuses there ...
    assert got["runpod"]["reason"].startswith(
        "storage_mounting: Mounting object stores is not supported on RunPod"
    )
    assert "multi-node" not in got["runpod"]["reason"]
    # ... and the documented RunPod edit (mode: COPY, docs/deploy.md) launches there
    text = (REPO / "sky/train-single.yaml").read_text()
    assert text.count("mode: MOUNT_CACHED") == 1
    copy = tmp_path / "train-single-runpod.yaml"
    copy.write_text(text.replace("mode: MOUNT_CACHED", "mode: COPY"))
    runpod = fits(catalogs, "load", copy, "standard", ["runpod"])["runpod"]
    assert runpod["types"] == ["8x_H100_SECURE"], runpod


def test_an_unknown_network_tier_is_one_line(catalogs: Path) -> None:
    proc = subprocess.run(
        [skypilot.sky_python(), "-m", "searchrl", "sky", "train", "--dry-run", "--network-tier", "fastest"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--network-tier: invalid choice: 'fastest'" in proc.stderr


# SkyPilot's own choice of the checkpoint bucket's store: `sky jobs launch` syncs storage mounts on the client
# (controller_utils.maybe_translate_local_file_mounts_and_sync_up -> Task.sync_storage_mounts), before the
# optimizer picks the job's cloud, and a mount with no `store:` gets `Task._get_preferred_store()`. Only the list
# of clouds with storage credentials is stood in for (it asks each cloud's credentials).
STORE = r"""
import json, sys
from pathlib import Path
from sky.data import storage as storage_lib
from searchrl.deploy import launch, tasks

storage_lib.get_cached_enabled_storage_cloud_names_or_refresh = lambda **kw: ["Nebius", "GCP", "AWS"]
how, path = sys.argv[1], Path(sys.argv[2])
if how.startswith("plan_train"):
    infra = how.partition(":")[2] or None
    task = launch.plan_train(envs={"CHECKPOINT_BUCKET": "b"}, yaml_path=path, dry_run=True, infra=infra).task
else:
    need_envs, need_secrets = tasks.required_names(path)
    task = tasks.load_task(path, {n: "placeholder" for n in need_envs}, {n: "s" for n in need_secrets})
mounts = task.storage_mounts or {}
store, region = task._get_preferred_store()
print(json.dumps({"store": store.value, "store_cloud": store.to_cloud().lower(), "store_region": region,
                  "unnamed": all(not s.stores for s in mounts.values()) and bool(mounts),
                  "clouds": [str(r.cloud).lower() if r.cloud else None for r in task.resources],
                  "regions": [r.region for r in task.resources]}))
"""


@pytest.mark.parametrize(
    ("how", "store", "region"),
    [
        ("plan_train", "S3", None),
        ("plan_train:gcp/us-central1", "GCS", "us-central1"),
        ("plan_train:nebius", "NEBIUS", None),
    ],
)
def test_the_checkpoint_bucket_is_created_in_the_cloud_the_planned_job_runs_in(
    catalogs: Path, how: str, store: str, region: str | None
) -> None:
    """Trap (issue 38 item 5): the plan allowed three clouds, and SkyPilot created the bucket in whichever came
    first in the task's set (Nebius, for a job that ran elsewhere: ~37 GB a save across clouds). The planned job now
    runs in one cloud, so SkyPilot's own rule puts the bucket there (with --infra's region, when it names one)."""
    env = {"SKY_RUNTIME_DIR": str(catalogs), "RETRIEVAL_API_KEY": "t"}
    got = sky_json(STORE, how, str(REPO / "sky/train.yaml"), env=env, timeout=180)
    assert got["unnamed"], got  # the file names no store: SkyPilot's _get_preferred_store decides
    assert got["store"] == store and got["store_region"] == region, got
    assert set(got["clouds"]) == {got["store_cloud"]}, (
        got
    )  # every resource the job may use is in the bucket's cloud


def test_a_by_hand_launch_creates_the_bucket_in_the_jobs_first_choice_of_cloud(catalogs: Path) -> None:
    """`sky jobs launch sky/train.yaml` without the plan: the file's `ordered` list makes its first entry both the
    bucket's cloud and the cloud the job tries first (an `any_of` set, or no list at all, left it to chance)."""
    env = {"SKY_RUNTIME_DIR": str(catalogs), "RETRIEVAL_API_KEY": "t"}
    got = sky_json(STORE, "load", str(REPO / "sky/train.yaml"), env=env, timeout=180)
    assert got["clouds"][0] == got["store_cloud"] == "aws", got
    unrestricted = sky_json(STORE, "load", str(tmp_copy_without_clouds(catalogs)), env=env, timeout=180)
    assert unrestricted["clouds"] == [None] and unrestricted["store_cloud"] == "nebius", (
        unrestricted
    )  # control
