"""`make train` / `make serve-retrieval-sky` and `searchrl sky train --dry-run` (issue 21 items 1 and 11).

The make targets are read with `make -n` (printed, nothing run); the dry run is the real CLI in SkyPilot's venv
with no service anywhere: it must print the task at once instead of waiting for one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
import yaml

from searchrl.deploy import skypilot
from tests.conftest import REPO

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make_n(*args: str) -> list[str]:
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", *args, "SKY_VENV=.venv-sky"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stdout.splitlines() if "searchrl sky" in ln or ln.startswith('echo "dry run')]


@needs_make
def test_make_train_runs_in_the_sky_venv_alone_with_the_network_tier() -> None:
    (line,) = make_n("train", "DRY_RUN=1", "NODES=2", "ENV=CHECKPOINT_BUCKET=b")
    assert line.startswith(".venv-sky/bin/python -m searchrl sky train ")  # no .venv/bin: no torch, no verl
    assert "--network-tier standard" in line and "--dry-run" in line
    (best,) = make_n("train", "NETWORK_TIER=best", "INFRA=aws/us-east-1")
    assert "--network-tier best" in best and "--infra aws/us-east-1" in best
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "train", "SKY_VENV=.venv-sky"], cwd=REPO, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "$(VENV)" not in proc.stdout and not any(
        ln.startswith(".venv/") for ln in proc.stdout.splitlines()
    )


@needs_make
def test_make_serve_retrieval_sky_passes_the_replica_size_and_dry_run_waits_for_nothing() -> None:
    serve, endpoint = make_n("serve-retrieval-sky", "CPUS=16+", "MEMORY=96+", "DISK_SIZE=256")
    assert "--cpus 16+ --memory 96+ --disk-size 256" in serve
    assert endpoint == ".venv-sky/bin/python -m searchrl sky endpoint searchrl-retrieval"
    serve, note = make_n("serve-retrieval-sky", "DRY_RUN=1")
    assert "--dry-run" in serve and note.startswith("echo") and "sky endpoint" not in note


def test_train_dry_run_without_a_service_prints_the_task_at_once() -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [skypilot.sky_python(), "-m", "searchrl", "sky", "train", "--dry-run", "--env", "CHECKPOINT_BUCKET=b",
         "--infra", "aws/us-east-1", "--network-tier", "best"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RETRIEVAL_API_KEY": "dry-run-token-1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60  # parsing only: no endpoint wait (2600 s by default), no health check
    task = yaml.safe_load(proc.stdout)
    assert task["envs"]["RETRIEVAL_SERVICE_URL"] == "http://unresolved-at-dry-run.invalid"
    assert "RETRIEVAL_SERVICE_URL above is a placeholder" in proc.stderr
    assert task["resources"]["infra"] == "aws/us-east-1" and task["resources"]["network_tier"] == "best"
    assert task["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert "dry-run-token-1" not in proc.stdout + proc.stderr


def _dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [skypilot.sky_python(), "-m", "searchrl", "sky", "train", "--dry-run", "--env", "CHECKPOINT_BUCKET=b", *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RETRIEVAL_API_KEY": "dry-run-token-1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _plan_comments(stdout: str) -> tuple[list[str], list[str]]:
    """The plan's comment lines after the task: (where it runs, what a step costs)."""
    lines = [ln.removeprefix("# ").strip() for ln in stdout.splitlines() if ln.startswith("# ")]
    split = lines.index("step cost (trainer/step_cost.py):")
    return lines[:split], lines[split:]


@pytest.mark.parametrize("nodes", [3, 6])
def test_a_node_count_the_trainer_would_refuse_is_refused_by_the_plan(nodes: int) -> None:
    """256 prompts x 5 samples a mini batch do not split over 24 or 48 GPUs: TrainSettings refused that only in
    the nodes' setup, after the install on every node. The plan builds the same settings from the task."""
    proc = _dry_run("--num-nodes", str(nodes))
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stdout == ""  # no task printed, nothing launched
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {nodes} node(s) x 8 GPUs: the trainer would refuse")
    assert f"(256 x 5) must be divisible by the GPU count NUM_NODES x GPUS_PER_NODE ({nodes} x 8)" in line


def test_the_two_node_plan_prints_packed_micro_batches_fsdp_per_node_and_cross_node_bytes() -> None:
    proc = _dry_run("--num-nodes", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert yaml.safe_load(proc.stdout)["num_nodes"] == 2  # the figures are comments: still one task file
    _, plan = _plan_comments(proc.stdout)
    assert plan[:2] == ["step cost (trainer/step_cost.py):", "2 node(s) x 8 GPUs:"]
    assert (
        plan[2].startswith("micro batches: packed") and "flash-attn" in plan[2]
    )  # FLASH_ATTN=1, the default
    assert plan[3] == "FSDP group: 8 GPUs (inside each node); gradient sync: once per mini batch"
    assert "update 15 x 2 mini batches, old log-prob 29, reference 29" in plan[4] and "ASSUMED" in plan[4]
    assert plan[5].startswith("ESTIMATE per step:") and "cross-node 24.7 GB per node" in plan[5]
    assert plan[6].startswith("ESTIMATE for 1005 steps:")
    deploy_md = (REPO / "docs" / "deploy.md").read_text()
    for line in plan[1:]:  # docs/deploy.md "What a step costs" shows this very output
        assert line in deploy_md, line
    sdpa = _dry_run("--num-nodes", "2", "--env", "FLASH_ATTN=0")  # the plan's own choice, and its reason
    assert sdpa.returncode == 0, sdpa.stderr[-2000:]
    _, lines = _plan_comments(sdpa.stdout)
    assert lines[2].startswith("micro batches: packed") and "ESTIMATED" in lines[2]
    for line in lines[2:3] + lines[5:]:
        assert line in deploy_md, line


def test_the_plan_says_which_cloud_it_pinned_and_how_to_move_it() -> None:
    """Issue 46 item 5: without --infra the job and its bucket are pinned to AWS; with no p5 quota there the managed
    job retries AWS forever. The plan now says so, and how to move (the lines docs/deploy.md shows)."""
    proc = _dry_run("--num-nodes", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    placement, _ = _plan_comments(proc.stdout)
    assert placement[0] == (
        "cloud: aws (the first cloud sky/train.yaml lists; --infra moves it): the job, every recovery and the "
        "checkpoint bucket b stay in aws"
    )
    assert "keeps retrying aws and never tries another cloud" in placement[1]
    assert placement[2].startswith("to run elsewhere: --infra gcp (make train INFRA=gcp; also nebius)")
    deploy_md = (REPO / "docs" / "deploy.md").read_text()
    for line in placement[1:]:
        assert line in deploy_md, line
    moved = _dry_run("--num-nodes", "2", "--infra", "gcp")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert (
        "# cloud: gcp (--infra): the job, every recovery and the checkpoint bucket b stay in gcp"
        in moved.stdout
    )
    assert "--infra aws (make train INFRA=aws; also nebius)" in moved.stdout


def test_sglang_with_the_default_model_is_refused_by_the_plan_with_one_line() -> None:
    """Issue 46 item 2: sglang 0.5.12 cannot read Qwen2's weights back, so the first sync would stop the run."""
    proc = _dry_run("--num-nodes", "2", "--env", "ROLLOUT=sglang")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        "error: 2 node(s) x 8 GPUs: the trainer would refuse these settings (ROLLOUT=sglang"
    )
    assert "Qwen2ForCausalLM has no get_weights_by_name" in line and "use ROLLOUT=vllm" in line
    llama = _dry_run(
        "--num-nodes", "2", "--env", "ROLLOUT=sglang", "--env", "MODEL_NAME=meta-llama/Llama-3.2-3B"
    )
    assert llama.returncode == 0, llama.stderr[-2000:]


@needs_make
def test_make_train_passes_rollout_when_it_is_not_the_default() -> None:
    (line,) = make_n("train", "DRY_RUN=1", "NODES=2", "ROLLOUT=sglang")
    assert "--env ROLLOUT=sglang" in line
    (plain,) = make_n("train", "DRY_RUN=1")
    assert "ROLLOUT=" not in plain  # the task file's default, vllm


# --- trainer modes (issue 40 item 4) ---------------------------------------------------------------------------


@needs_make
def test_make_train_passes_the_trainer_mode_and_rollout_nodes() -> None:
    (line,) = make_n("train", "DRY_RUN=1", "NODES=2", "TRAINER_MODE=separate_async", "ROLLOUT_NODES=1")
    assert "--env TRAINER_MODE=separate_async --env ROLLOUT_NODES=1" in line
    (plain,) = make_n("train", "DRY_RUN=1")
    assert "TRAINER_MODE" not in plain and "ROLLOUT_NODES" not in plain  # the task file's defaults: sync


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_each_trainer_mode_renders_for_two_nodes(mode: str) -> None:
    """SkyPilot's own parser builds the task with the mode (searchrl/deploy/tasks.py load_task), and the plan
    validates the nodes' TrainSettings with it: separate_async trains on one node and generates on the other."""
    proc = _dry_run("--num-nodes", "2", "--env", f"TRAINER_MODE={mode}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    task = yaml.safe_load(proc.stdout)
    assert task["num_nodes"] == 2 and task["envs"]["TRAINER_MODE"] == mode
    assert task["envs"]["ROLLOUT_NODES"] == "0"  # the file's default: one rollout node in separate_async
    _, plan = _plan_comments(proc.stdout)
    assert plan[1] == "2 node(s) x 8 GPUs:"
    if mode == "sync":
        assert plan[2].startswith("micro batches:")  # the plan docs/deploy.md shows, unchanged
    elif mode == "colocate_async":
        assert plan[2].startswith("trainer mode: colocate_async (rollout and actor share every GPU)")
        assert plan[4] == "FSDP group: 8 GPUs (inside each node); gradient sync: once per mini batch"
    else:
        assert plan[2].startswith(
            "trainer mode: separate_async: trainer 1 node(s), rollout 1 node(s) x 8 GPUs; weights pushed over "
            "nccl after every 2 updates; staleness bound 2 weight versions (drop beyond it)"
        )
        # one trainer node: FSDP spans it alone, and the update's 256 x 5 samples split over its 8 GPUs
        assert plan[4] == "FSDP group: 8 GPUs (the node's GPUs); gradient sync: after every micro batch"
        assert "update 29 x 2 mini batches" in plan[5]


def test_separate_async_on_one_node_is_refused_by_the_plan() -> None:
    proc = _dry_run("--num-nodes", "1", "--env", "TRAINER_MODE=separate_async")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: 1 node(s) x 8 GPUs: the trainer would refuse these settings")
    assert "needs a trainer node beside the rollout nodes" in line


# --- the multi-node trainer rehearsed on one node (issue 53 item 4) -------------------------------------------------


@needs_make
def test_make_train_passes_the_rehearsal_switch() -> None:
    (line,) = make_n("train", "DRY_RUN=1", "NODES=1", "REHEARSE_MULTI_NODE=1")
    assert "--num-nodes 1" in line and "--env REHEARSE_MULTI_NODE=1" in line
    (plain,) = make_n("train", "DRY_RUN=1", "NODES=1")
    assert "REHEARSE_MULTI_NODE" not in plain  # the task file's default, "0"


def test_the_rehearsal_dry_run_says_so_and_prints_the_fsdp_layout() -> None:
    """`make train DRY_RUN=1 NODES=1 REHEARSE_MULTI_NODE=1`: the plan says it rehearses, with what the overrides
    render (FSDP2, no-sync, HSDP 2 x 4), and counts no cross-node bytes: the two replicas share the node."""
    proc = _dry_run("--num-nodes", "1", "--env", "REHEARSE_MULTI_NODE=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    task = yaml.safe_load(proc.stdout)
    assert task["num_nodes"] == 1 and task["envs"]["REHEARSE_MULTI_NODE"] == "1"
    _, plan = _plan_comments(proc.stdout)
    assert plan[1:3] == [
        "1 node(s) x 8 GPUs:",
        "rehearsal of the multi-node trainer on one node: FSDP2, no-sync, HSDP 2 x 4 (fsdp_size 4)",
    ]
    assert plan[3].startswith("micro batches: packed")
    assert plan[4] == (
        "FSDP group: 4 GPUs (HSDP 2 x 4 inside the node, as on 2 nodes); gradient sync: once per mini batch"
    )
    assert "cross-node 0.0 GB per node" in plan[6]
    plain = _dry_run("--num-nodes", "1")
    assert not any("rehearsal" in line for line in _plan_comments(plain.stdout)[1])


def test_the_rehearsal_on_two_nodes_is_refused_by_the_plan() -> None:
    proc = _dry_run("--num-nodes", "2", "--env", "REHEARSE_MULTI_NODE=1")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line == (
        "error: 2 node(s) x 8 GPUs: the trainer would refuse these settings (REHEARSE_MULTI_NODE=1 rehearses the "
        "multi-node trainer on one node, but NUM_NODES=2 already renders FSDP2, no-sync and HSDP across the nodes: "
        "unset REHEARSE_MULTI_NODE or use NUM_NODES=1)"
    )
