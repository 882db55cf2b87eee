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
if how == "plan_train":  # exactly what `searchrl sky train --dry-run` / `make train DRY_RUN=1` builds
    task = launch.plan_train(envs={"CHECKPOINT_BUCKET": "b"}, yaml_path=path, dry_run=True, network_tier=tier)
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


def test_the_default_multinode_train_request_has_candidates_on_every_documented_cloud(catalogs: Path) -> None:
    got = fits(catalogs, "plan_train", REPO / "sky/train.yaml", "standard")
    for cloud in ["aws", "gcp", "azure", "lambda", "nebius", "kubernetes"]:
        assert got[cloud]["types"], f"{cloud}: {got[cloud]['reason']}"
    assert got["aws"]["types"] == ["p5.48xlarge"] and got["kubernetes"]["types"] == ["32CPU--128GB--H100:8"]
    # RunPod has no multi-node in SkyPilot (and no bucket mounts): docs/deploy.md says so
    assert not got["runpod"]["types"]
    assert "multi-node: Multi-node not supported" in got["runpod"]["reason"]


def test_the_file_itself_asks_for_no_network_tier(catalogs: Path) -> None:
    """`sky jobs launch sky/train.yaml` by hand gets the same clouds as `make train` (the tier is a flag)."""
    got = fits(catalogs, "load", REPO / "sky/train.yaml", "file", ["azure", "lambda", "kubernetes"])
    assert all(v["types"] for v in got.values()), got


def test_network_tier_best_keeps_only_aws_gcp_and_nebius(catalogs: Path) -> None:
    got = fits(catalogs, "plan_train", REPO / "sky/train.yaml", "best")
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
