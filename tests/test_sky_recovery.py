"""Managed-job recovery and idle cost of the GPU tasks (issues 21 and 38), with SkyPilot 0.14.1's own code.

- Recovery: the task's `job_recovery` goes through `StrategyExecutor.make` (what the jobs controller calls) and
  its restart decision is `should_restart_on_failure(exit_codes)`, the controller's own call after a failed run.
  SkyPilot has no "never restart this exit code" setting (its `recover_on_exit_codes` restarts without limit), so
  trainer/node/refusal.py turns the same failure of a step twice in a row (a refusal, an outage, a crash with no new
  checkpoint in between) into a clean stop; the loop below is the controller's decision fed with the real guard's
  exit codes.
- Autostop: every task file that asks for a GPU is parsed by SkyPilot and launched the way a plain `sky launch`
  (no -i/--down) applies it.
- Each node's run script is built by SkyPilot's codegen and run in a fake node (tests/test_sky_yaml.py `run_node`).
- GPU_STACK=image pins come from a real `--system-site-packages` venv over this machine's python3 (its Debian
  packages stand in for the image's), frozen with the real pip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import test_sky_yaml as harness
from tests.conftest import REPO
from tests.sky_code import sky_json
from tests.trainer.conftest import write_flash_attn, write_image_site

GUARD = REPO / "trainer" / "node" / "refusal.py"

EXECUTOR = r"""
import asyncio, json, sys
from pathlib import Path
from sky.backends import CloudVmRayBackend
from sky.jobs import recovery_strategy
from searchrl.deploy import tasks

path = Path(sys.argv[1])
need_envs, need_secrets = tasks.required_names(path)
task = tasks.load_task(path, {n: "placeholder" for n in need_envs}, {n: "s" for n in need_secrets})
ex = recovery_strategy.StrategyExecutor.make("c", CloudVmRayBackend(), task, 1, 0, None, set(), asyncio.Lock(),
                                             asyncio.Condition())
decisions = []
for line in sys.stdin:  # one attempt's exit codes per line: does the controller restart the job?
    decisions.append(ex.should_restart_on_failure(exit_codes=json.loads(line)))
print(json.dumps({"strategy": type(ex).__name__, "max": ex.max_restarts_on_errors,
                  "recover_codes": ex.recover_on_exit_codes, "decisions": decisions}))
"""


def controller(yaml_name: str, attempts: list[list[int]]) -> dict:
    stdin = "".join(json.dumps(a) + "\n" for a in attempts)
    return sky_json(EXECUTOR, str(REPO / "sky" / yaml_name), stdin=stdin)


@pytest.mark.parametrize("yaml_name", ["train.yaml", "train-single.yaml"])
def test_recovery_retries_in_place_first_and_restarts_at_most_three_times(yaml_name: str) -> None:
    got = controller(yaml_name, [[1], [1], [1], [1]])
    # FAILOVER relaunches on the launched cloud/region first (EAGER_NEXT_REGION tears down and goes elsewhere)
    assert got["strategy"] == "FailoverStrategyExecutor"
    assert got["max"] == 3 and got["recover_codes"] == []  # no exit code restarts without limit
    assert got["decisions"] == [True, True, True, False]  # crashes: 3 restarts, then the job fails


# One step (the same command on every attempt, as in train.yaml) whose outcome the environment sets.
STEP = (
    "import os, sys; print('error: ' + os.environ['MSG'], file=sys.stderr); sys.exit(int(os.environ['CODE']))"
)


def refuse(state: Path, task_id: str | None, message: str = "EXPERIMENT_NAME=x was started with other settings",
           code: int = 2) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The guard around a step that prints `error: <message>` and exits `code` (searchrl's refusal is 2)."""
    env = {k: v for k, v in os.environ.items() if k != "SKYPILOT_TASK_ID"}
    env |= {"MSG": message, "CODE": str(code)}
    if task_id:
        env["SKYPILOT_TASK_ID"] = task_id
    return subprocess.run(
        [sys.executable, str(GUARD), "--state", str(state), "--", sys.executable, "-c", STEP],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def guard(state: Path, task_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    """trainer/node/refusal.py with these arguments, as one attempt of managed job `task_id` runs it."""
    return subprocess.run(
        [sys.executable, str(GUARD), "--state", str(state), *args],
        env={**os.environ, "SKYPILOT_TASK_ID": task_id}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def attempts(
    state: Path,
    task_id: str,
    step: list[str] | None = None,
    n: int = 6,
    *,
    steps: list[list[str]] | None = None,
    between: Callable[[int], None] | None = None,
) -> tuple[list[int], str]:
    """`n` attempts of one managed job as train.yaml runs them: setup's `--check`, then the guarded steps (guard
    arguments before `--`, then the command), stopping at the first that fails. `between(i)` runs before attempt
    i (what the previous attempt left in the bucket). Returns each attempt's exit code (what SkyPilot's
    controller sees) and all of their stderr."""
    plan = steps if steps is not None else [["--", *(step or [])]]
    codes, err = [], ""
    for i in range(n):
        if between is not None:
            between(i)
        check = guard(state, task_id, "--check")
        err += check.stderr
        if check.returncode:
            codes.append(check.returncode)
            continue
        code = 0
        for args in plan:
            ran = guard(state, task_id, *args)
            err += ran.stderr
            code = ran.returncode
            if code:
                break
        codes.append(code)
    return codes, err


def test_a_repeated_refusal_stops_the_managed_job_as_failed(tmp_path: Path) -> None:
    """The controller's real restart decision, fed with what the guard returns on each attempt."""
    state = tmp_path / "bucket/.searchrl-refusals"
    task = "sky-managed-2026-11-25_searchrl-train_7-0"
    refusal = [sys.executable, "-c", "import sys; print('error: EXPERIMENT_NAME=x was started with other settings',"
               " file=sys.stderr); sys.exit(2)"]  # fmt: skip
    codes, err = attempts(state, task, refusal, n=4)
    # refused, restarted once (a transient cause gets its retry), then stopped: 78, and every later attempt ends
    # at setup's first line with 78 (seconds, on the nodes FAILOVER kept)
    assert codes == [2, 78, 78, 78]
    decisions = controller("train.yaml", [[c] for c in codes])["decisions"]
    assert decisions == [True, True, True, False]  # the job ends FAILED(_SETUP), not SUCCEEDED as before (0)
    assert "stopped: the same refusal as the previous attempt" in err
    assert "error: EXPERIMENT_NAME=x was started with other settings" in err
    assert err.count("stopped: ") == 3  # the stop, then each later attempt says why it ends (sky jobs logs)
    skipped = guard(state, task, "--", "false")  # a step reached anyway is skipped, and fails too
    assert skipped.returncode == 78 and "stopped: skipping `false`" in skipped.stderr
    # the old flag still answers "was it stopped" for scripts
    assert guard(state, task, "--stopped").returncode == 0


def test_a_step_check_that_stops_every_attempt_ends_the_job_at_the_second_whatever_it_measured(
    tmp_path: Path,
) -> None:
    """Issue 46: the step check's line carries the value it measured, which differs on every attempt; the guard
    recognises the check (values masked), so a systematic stop (a rollout/actor bias at step 1) costs two
    attempts of 2 x 8 H100, not four."""
    state = tmp_path / "bucket/.searchrl-refusals"
    count = tmp_path / "attempt"
    stop = [sys.executable, "-c", "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
            "if p.exists() else 0; p.write_text('x' * (n + 1)); v = 0.0123 + n * 0.0007; "
            "print(f'error: step 1: rollout/actor mean prob diff {v:.4g} >= 0.01 (verl FAQ); verl stopped at step 1',"
            " file=sys.stderr); sys.exit(2)", str(count)]  # fmt: skip
    codes, err = attempts(state, "sky-managed-x_searchrl-train_5-0", stop, n=3)
    values = {
        line.split("prob diff ")[1].split()[0] for line in err.splitlines() if line.startswith("error: ")
    }
    assert len(values) == 2, err  # two attempts ran, each measured its own value
    assert codes == [2, 78, 78], err[-2000:]
    assert "stopped: the same refusal as the previous attempt" in err and "prob diff <value>" in err


@pytest.mark.live
def test_a_retrieval_outage_is_restarted_once_then_stopped(tmp_path: Path) -> None:
    """Fault 2: SkyServe's own load balancer with no READY replica (its only one being replaced) answers 503.
    Issue 21: `searchrl health` exits 75 (not 2), so the outage is restarted, never read as a refusal. Issue 38:
    the second outage in a row stops the job (before: four waits of HEALTH_DEADLINE_S on 2 x 8 H100)."""
    from tests.skyserve_lb import skyserve_load_balancer

    state = tmp_path / "refusals"
    with skyserve_load_balancer([], ready_status=503) as url:
        # the balancer tries 3 times (1 s back-off) before its 503: each attempt waits past that
        health = [sys.executable, "-m", "searchrl", "health", url, "--deadline", "5"]
        codes, err = attempts(state, "sky-managed-x_searchrl-train_9-0", health, n=4)
    assert codes == [75, 78, 78, 78], err[-2000:]
    assert "503" in err and "outage: " in err
    assert "stopped: the retrieval service was unavailable on two attempts in a row" in err
    decisions = controller("train.yaml", [[c] for c in codes])["decisions"]
    assert decisions == [True, True, True, False]  # FAILED(_SETUP), never SUCCEEDED


def test_crashes_and_different_refusals_keep_skypilots_restarts(tmp_path: Path) -> None:
    state = tmp_path / "refusals"
    task = "sky-managed-x_searchrl-train_8-0"
    assert refuse(state, task).returncode == 2
    assert refuse(state, task, code=1).returncode == 1  # a crash in between: only consecutive refusals count
    assert refuse(state, task).returncode == 2
    assert refuse(state, task, message="another reason").returncode == 2
    assert refuse(state, "sky-managed-y_other-job_9-0").returncode == 2  # another job is not this one
    assert not list(state.glob("*.stopped"))
    # outside a managed job (plain `sky launch`: nothing restarts it) the step runs unchanged
    assert [refuse(state, None).returncode for _ in range(3)] == [2, 2, 2]


def test_a_refusal_after_a_healthy_check_still_stops_the_job(tmp_path: Path) -> None:
    """Each attempt of train.yaml runs the health check (passes) before `searchrl train local` (refuses: settings
    changed under the same EXPERIMENT_NAME). Before, the check's success cleared the refusal record, so the same
    refusal never counted twice and cost four attempts; now each step keeps its own record."""
    state = tmp_path / "bucket/.searchrl-refusals"
    healthy = ["--", sys.executable, "-c", "print('ok')"]
    refusing = ["--", sys.executable, "-c", STEP]
    os.environ.update(MSG="EXPERIMENT_NAME=x was started with other settings", CODE="2")
    try:
        codes, err = attempts(state, "sky-managed-x_searchrl-train_3-0", steps=[healthy, refusing], n=4)
    finally:
        del os.environ["MSG"], os.environ["CODE"]
    assert codes == [2, 78, 78, 78], err[-2000:]
    assert "stopped: the same refusal as the previous attempt" in err


def test_an_unreachable_service_stops_the_job_at_the_second_outage(tmp_path: Path) -> None:
    """The real `searchrl health` against a port nobody listens on exits 75 (an outage) after its deadline. Before,
    75 was never counted: 4 attempts of HEALTH_DEADLINE_S (2,600 s) on 2 x 8 H100. Now the second outage in a row
    stops the job, and every restart SkyPilot still grants ends at setup's first line."""
    state = tmp_path / "refusals"
    health = [sys.executable, "-m", "searchrl", "health", "http://127.0.0.1:9", "--deadline", "1"]
    codes, err = attempts(state, "sky-managed-x_searchrl-train_4-0", health, n=4)
    assert codes == [75, 78, 78, 78], err[-2000:]
    assert err.count("outage: ") == 1 and "a second outage in a row stops it" in err
    assert "stopped: the retrieval service was unavailable on two attempts in a row" in err
    assert controller("train.yaml", [[c] for c in codes])["decisions"] == [True, True, True, False]
    # an attempt whose check passes in between breaks the streak: outages must be consecutive
    other = tmp_path / "other"
    assert attempts(other, "t-1", health, n=1)[0] == [75]
    assert attempts(other, "t-1", [sys.executable, "-c", "pass"], n=1)[0] == [0]  # not the same step: kept
    assert attempts(other, "t-1", health, n=1)[0] == [78]
    assert attempts(state.parent / "third", "t-2", health, n=1)[0] == [75]


# A crash as `searchrl train local` shows it: verl's output (stderr merged into stdout by trainer/launch.py) with
# Ray's prefixes, a RayTaskError naming the actor, the inner exception last, then Hydra's hint on stderr. Pids,
# addresses, actor ids, object addresses and the time differ on every run.
FAKE_VERL = r"""
import os, random, sys, time
ip = lambda: f"10.0.0.{random.randint(2, 200)}"
print(f"(TaskRunner pid={os.getpid()}, ip={ip()}) step:3 - critic/score/mean:0.41", flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "verl/trainer/ppo/ray_trainer.py", line 1203, in fit', flush=True)
print(f"ray.exceptions.RayTaskError({os.environ['KIND']}): ray::WorkerDict.actor_rollout_update_actor() "
      f"(pid={os.getpid()}, ip={ip()}, actor_id={os.urandom(16).hex()}, repr=<WorkerDict object at {hex(id(ip))}>)",
      flush=True)
detail = {"DistBackendError": f"NCCL error: remote process exited at {ip()}:{random.randint(20000, 30000)}",
          "OutOfMemoryError": "CUDA out of memory. Tried to allocate 2.00 GiB"}[os.environ["KIND"]]
stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f".{random.randint(0, 999999)}"
print(f"torch.{os.environ['KIND']}: {detail} ({stamp}, pid {os.getpid()})", flush=True)
print("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
sys.exit(1)
"""


def save_checkpoint(run_dir: Path, step: int, *, world_size: int = 2, complete: bool = True) -> None:
    """What verl leaves in the bucket: fsdp_config.json, every rank's `torch.save` shard, the tracker file."""
    import torch

    actor = run_dir / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world_size}))
    for rank in range(
        world_size if complete else world_size - 1
    ):  # incomplete: one node's shard never uploaded
        torch.save({"w": torch.zeros(2)}, actor / f"model_world_size_{world_size}_rank_{rank}.pt")
    (run_dir / "latest_checkpointed_iteration.txt").write_text(str(step))


def crash_attempts(tmp_path: Path, kinds: list[str], between: Callable[[int], None] | None = None,
                   run_dir: Path | None = None) -> tuple[list[int], str]:  # fmt: skip
    """One attempt per entry of `kinds`: `searchrl train local` (here FAKE_VERL) crashing with that exception."""
    script = tmp_path / "fake_verl.py"
    script.write_text(FAKE_VERL)
    state = tmp_path / "bucket/.searchrl-refusals"
    run_dir = run_dir or tmp_path / "bucket/run"
    step = ["--run-dir", str(run_dir), "--", sys.executable, str(script)]
    codes, err = [], ""
    for i, kind in enumerate(kinds):
        os.environ["KIND"] = kind
        try:
            got, text = attempts(state, "sky-managed-x_searchrl-train_5-0", steps=[step], n=1,
                                 between=(lambda _i, i=i: between(i)) if between else None)  # fmt: skip
        finally:
            del os.environ["KIND"]
        codes += got
        err += text
    return codes, err


def test_the_same_crash_twice_without_a_new_checkpoint_stops_the_job(tmp_path: Path) -> None:
    """Before: a deterministic crash (a verl traceback, exit 1) was relaunched 3 times on 2 x 8 H100."""
    run_dir = tmp_path / "bucket/run"
    save_checkpoint(run_dir, 10)
    codes, err = crash_attempts(tmp_path, ["DistBackendError"] * 4, run_dir=run_dir)
    assert codes == [1, 78, 78, 78], err[-3000:]
    assert "crash: `" in err and "exit 1: torch.DistBackendError: NCCL error" in err  # Hydra's hint is not it
    assert (
        "stopped: the same crash as the previous attempt with no new checkpoint in between (newest complete "
        "checkpoint still step 10)" in err
    )
    assert controller("train.yaml", [[c] for c in codes])["decisions"] == [True, True, True, False]


def test_a_crash_after_progress_keeps_its_restarts(tmp_path: Path) -> None:
    """A new complete checkpoint since the last crash keeps the restarts; an incomplete one (a node's shard never
    reached the bucket: the resume falls back past it) is not progress; another crash is not the same crash."""
    run_dir = tmp_path / "bucket/run"

    def progress(attempt: int) -> None:  # what the previous attempt saved before it crashed
        if attempt == 1:
            save_checkpoint(run_dir, 20)
        if attempt == 2:
            save_checkpoint(run_dir, 30, complete=False)

    codes, err = crash_attempts(tmp_path, ["DistBackendError"] * 4, between=progress, run_dir=run_dir)
    assert codes == [1, 1, 78, 78], err[-3000:]
    assert "newest complete checkpoint still step 20" in err
    other = tmp_path / "other"
    other.mkdir()
    mixed, err = crash_attempts(other, ["DistBackendError", "OutOfMemoryError"] * 2)
    assert mixed == [1, 1, 1, 1], err[-3000:]  # a different crash each time: SkyPilot's restarts, as before


def test_unreadable_progress_never_stops_a_crashing_job(tmp_path: Path) -> None:
    """`--run-dir` needs the venv's searchrl (trainer/checkpoint.py); without it the guard cannot tell progress
    from none, so it keeps SkyPilot's restarts rather than stop a run that may be saving checkpoints."""
    script = tmp_path / "fake_verl.py"
    script.write_text(FAKE_VERL)
    env = {"PATH": "/usr/bin:/bin", "SKYPILOT_TASK_ID": "sky-managed-x_t_6-0", "KIND": "OutOfMemoryError"}
    argv = ["/usr/bin/python3", "-I", str(GUARD), "--state", str(tmp_path / "state"), "--run-dir", str(tmp_path),
            "--", "/usr/bin/python3", str(script)]  # fmt: skip
    runs = [subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60) for _ in range(3)]
    assert [r.returncode for r in runs] == [1, 1, 1], runs[-1].stderr[-2000:]
    assert "cannot read the checkpoints in" in runs[0].stderr and "stopped: " not in runs[-1].stderr


def test_crash_signatures_ignore_what_differs_between_runs() -> None:
    sys.path.insert(0, str(REPO / "trainer" / "node"))
    try:
        import refusal
    finally:
        sys.path.remove(str(REPO / "trainer" / "node"))
    a = "(WorkerDict pid=4242, ip=10.0.0.7) RuntimeError: NCCL timeout at 2026-11-27 07:01:02.123 on 10.0.0.7:29500 (actor 3e1f5c2a8d7b9c0e, 0x7f2b3c4d5e60)"
    b = "(WorkerDict pid=77, ip=10.0.1.9) RuntimeError: NCCL timeout at 2026-11-28 11:22:33.9 on 10.0.1.9:29511 (actor 9a8b7c6d5e4f3a2b, 0x7f00aa11bb22)"
    assert refusal.normalise(a) == refusal.normalise(b)
    assert refusal.crash_signature(1, a, None) != refusal.crash_signature(
        134, b, None
    )  # the exit code counts
    assert refusal.normalise(a) != refusal.normalise(a.replace("NCCL timeout", "CUDA error"))
    # measured values are masked, versions and integers (steps, counts) are not
    assert refusal.normalise("diff 0.0123 >= 0.01 at step 1") == refusal.normalise(
        "diff 1.3e-02 >= 0.01 at step 1"
    )
    assert refusal.normalise("at step 1") != refusal.normalise("at step 2")
    assert refusal.normalise("verl 0.9.1") != refusal.normalise("verl 0.9.2")
    assert refusal.is_exception_line("torch.OutOfMemoryError: CUDA out of memory.")
    assert not refusal.is_exception_line(
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    )
    assert not refusal.is_exception_line("(TaskRunner pid=1) step:3 - critic/score/mean:0.41")


# --- run scripts as SkyPilot builds them (tests/test_sky_yaml.py harness) ----------------------------------------


def test_a_failed_head_waits_for_the_workers_to_flush_before_it_fails(tmp_path: Path) -> None:
    """SkyPilot force-cancels every other node once one node's script fails: the head must not fail first."""
    rc, stdout, calls = harness.run_node("train.yaml", tmp_path, nodes=2, FAIL_ON="train local")
    assert rc == 7
    lines = calls.splitlines()
    grace = lines.index("sleep 300")
    assert lines.index("stop_cluster") < grace  # the workers see the head's Ray go, then have the grace
    assert grace < max(
        i for i, ln in enumerate(lines) if ln.startswith("sleep 10")
    )  # before the head's flush
    assert "waiting 300s for the workers to flush their checkpoint shards" in stdout
    ok_rc, _, ok_calls = harness.run_node("train.yaml", tmp_path / "ok", nodes=2)
    assert ok_rc == 0 and "sleep 300" not in ok_calls  # a head that succeeded leaves at once


def test_no_flush_grace_when_the_health_check_fails(tmp_path: Path) -> None:
    """Before: an unreachable service failed the head after HEALTH_DEADLINE_S and it then slept
    WORKER_FLUSH_GRACE_S (300 s on 2 x 8 H100) for shards nobody had written: verl never started."""
    health = "health placeholder --deadline 2600"  # the run's first step (RETRIEVAL_SERVICE_URL=placeholder)
    rc, stdout, calls = harness.run_node("train.yaml", tmp_path, nodes=2, FAIL_ON=health)
    assert rc == 7, stdout[-2000:]
    assert f"searchrl {health}" in calls and "searchrl train local" not in calls
    assert "sleep 300" not in calls and "waiting 300s" not in stdout
    assert calls.rindex("stop_cluster") < calls.index("sleep 10")  # the workers see the head's Ray go at once
    assert harness._flushed(stdout)  # the head's own records still reach the bucket


def test_the_gpu_job_never_merges_and_the_merge_task_runs_on_a_cpu_node(tmp_path: Path) -> None:
    """Before: `searchrl train merge` (tracker settle, verl's merger, a transformers load check, then the upload
    of the merged model in the flush loop) ran last on the head while all 16 GPUs were still billed."""
    rc, stdout, calls = harness.run_node("train.yaml", tmp_path / "head", nodes=2)
    assert rc == 0, stdout[-2000:]
    assert "searchrl train local" in calls and "searchrl train merge" not in calls
    assert calls.index("searchrl train run-dir") < calls.index("searchrl train local")
    rc, stdout, calls = harness.run_node("merge.yaml", tmp_path / "cpu")
    assert rc == 0, stdout[-2000:]
    assert harness._flushed(stdout)  # the merged model is uploaded before the task ends
    assert calls.index("searchrl train merge") < calls.index("sleep 10")


PIPELINE = r"""
import json, sys
from pathlib import Path
import networkx
from searchrl.deploy import launch, tasks

envs = json.loads(sys.argv[1])
train = tasks.load_task(Path("sky/train.yaml"), envs, {"RETRIEVAL_API_KEY": "s"})
from searchrl.deploy.feasibility import pin_one_cloud
pin_one_cloud(train)  # as plan_train does: one cloud for the job and its bucket
built = launch.train_pipeline(train, job_name="searchrl-train")
# what `sky.jobs.launch` sends the API server (jobs/client/sdk.py) and the server loads back
from sky.utils import dag_utils
dag = dag_utils.load_dag_from_yaml_str(dag_utils.dump_dag_to_yaml_str(built))
order = [t.name for t in networkx.topological_sort(dag.get_graph())]
merge = dag.tasks[1]
print(json.dumps({
    "chain": dag.is_chain(), "order": order, "name": dag.name, "nodes": [t.num_nodes for t in dag.tasks],
    "accelerators": [[r.accelerators for r in t.resources] for t in dag.tasks],
    "clouds": [[str(r.cloud).lower() for r in t.resources] for t in dag.tasks],
    "autostop": [(r.autostop_config.idle_minutes, r.autostop_config.down) for r in merge.resources],
    "buckets": [t.storage_mounts["/checkpoints"].name for t in dag.tasks],
    "envs": [dict(t.envs) for t in dag.tasks],
    "run": merge.run,
}))
"""


@pytest.mark.parametrize("envs", [{}, {"EXPERIMENT_NAME": "my-run"}])
def test_sky_train_launches_the_merge_as_a_cpu_task_after_training(envs: dict[str, str]) -> None:
    """`searchrl sky train` launches one managed job of two tasks (SkyPilot's chain DAG): the merge starts once
    training succeeded, on its own CPU cluster, and names the same run folder in the same bucket."""
    given = {"RETRIEVAL_SERVICE_URL": "http://h:1", "CHECKPOINT_BUCKET": "my-ckpts", "DATASET_SIZE": "small",
             "TOTAL_STEPS": "50", **envs}  # fmt: skip
    got = sky_json(PIPELINE, json.dumps(given))
    assert (
        got["chain"]
        and got["order"] == ["searchrl-train", "searchrl-merge"]
        and got["name"] == "searchrl-train"
    )
    assert got["accelerators"] == [[{"H100": 8}], [None]] and got["nodes"] == [
        2,
        1,
    ]  # no GPU waits for the merge
    assert got["autostop"] == [[10, True]] and got["buckets"] == ["my-ckpts", "my-ckpts"]
    assert got["clouds"] == [["aws"], ["aws"]]  # the merge runs in the cloud of the bucket it reads
    assert "searchrl train merge" in got["run"]
    dirs = [
        subprocess.run([sys.executable, "-m", "searchrl", "train", "run-dir"], env={**os.environ, **task_envs},
                       capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        for task_envs in got["envs"]
    ]  # fmt: skip
    assert dirs[0] == dirs[1]
    assert dirs[0].endswith(envs.get("EXPERIMENT_NAME", "search-r1-qwen2.5-3b-instruct-small-50steps"))


AUTOSTOP = r"""
import json
from pathlib import Path
from searchrl.deploy import tasks

out = {}
for path in sorted(Path("sky").glob("*.yaml")):
    need_envs, need_secrets = tasks.required_names(path)
    task = tasks.load_task(path, {n: "placeholder" for n in need_envs}, {n: "s" for n in need_secrets})
    confs = []
    for r in task.resources:
        r.override_autostop_config(down=False, idle_minutes=None)  # `sky launch FILE` without -i/--down
        a = r.autostop_config
        confs.append(None if a is None else [a.enabled, a.idle_minutes, a.down])
    out[path.name] = {"gpu": any(r.accelerators for r in task.resources), "autostop": confs}
print(json.dumps(out))
"""


def test_every_gpu_task_file_deletes_its_nodes_when_idle() -> None:
    """Before: sky/train.yaml had no autostop, so a plain `sky launch sky/train.yaml` (no -i/--down) left 2 x 8 H100
    up and billing after the run (16 H100-hours per idle hour). SkyPilot's parser reads each file's
    `resources.autostop` as a launch without flags keeps it (execution.launch's override is a no-op then)."""
    got = sky_json(AUTOSTOP)
    gpu = {name for name, v in got.items() if v["gpu"]}
    assert {"train.yaml", "train-single.yaml", "infer.yaml"} <= gpu, got
    for name in gpu:
        assert got[name]["autostop"] and all(a == [True, 10, True] for a in got[name]["autostop"]), (
            name,
            got[name],
        )


def test_each_worker_check_has_a_timeout_and_the_wait_has_a_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stubs = dict(harness.STUBS)
    stubs["timeout"] = 'echo "timeout $*" >> "$HOME/calls.log"; shift; exec "$@"'
    # the clock: 0 at the start, then past WORKER_MAX_HOURS (48 h) after two checks
    stubs["date"] = (
        'n=$(grep -c "^timeout " "$HOME/calls.log" || true); [ "$n" -lt 2 ] && echo 1000 || echo $((1000 + 48 * 3600))'
    )
    monkeypatch.setattr(harness, "STUBS", stubs)
    rc, stdout, calls = harness.run_node("train.yaml", tmp_path, rank=1, nodes=2, HEAD_RAY_CHECKS="100000")
    assert rc == 0, stdout[-2000:]
    checks = [ln for ln in calls.splitlines() if ln.startswith("timeout ")]
    assert checks == ["timeout 10 ray health-check --address 10.0.0.1:6379"] * 2
    assert "still answers after WORKER_MAX_HOURS=48 h: leaving so this node stops billing" in stdout
    assert harness._flushed(stdout)  # it leaves through the flush loop, like a normal exit


@pytest.mark.parametrize("fail_on", ["", "train local"])
def test_train_single_stops_its_ray_however_it_ends(tmp_path: Path, fail_on: str) -> None:
    rc, stdout, calls = harness.run_node("train-single.yaml", tmp_path, FAIL_ON=fail_on)
    assert rc == (7 if fail_on else 0), stdout[-2000:]
    lines = calls.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("start_cluster"))
    stops = [i for i, ln in enumerate(lines) if ln == "stop_cluster"]
    assert stops[0] < start  # a stale Ray from a killed attempt is not reused under the rebuilt .venv
    assert stops[-1] > lines.index(f"searchrl train {'local' if fail_on else 'merge'}")  # the exit trap
    assert stops[-1] < max(i for i, ln in enumerate(lines) if ln.startswith("sleep 10"))  # before the flush
    assert "ray stop" not in calls  # it would kill SkyPilot's own Ray (6380) and the job


def test_train_nodes_never_keep_an_old_ray_and_prepare_data_before_run(tmp_path: Path) -> None:
    """Fault 5: the head called start_cluster, which keeps a running Ray as it is, without stopping a Ray left by
    a force-cancelled attempt (the old .venv's code), and every node prepared data in run, before start_cluster,
    so nodes finishing it more than 300 s apart failed its joins. Now setup (which ends on every node before run
    starts on any) kills our Ray (6379, never SkyPilot's 6380) and prepares the data; the head checks again."""
    _, setup = harness.run_setup("train.yaml", tmp_path / "setup", attempts=1)
    lines = setup.splitlines()
    kill = lines.index("pkill -9 -f ray.*[=:]6379")
    venv = next(i for i, ln in enumerate(lines) if ln.startswith("uv venv"))
    assert kill < venv  # before the venv is replaced
    data, tool = lines.index("searchrl train data"), lines.index("searchrl train tool-config")
    assert lines.index("uv pip install --no-deps -e .") < data < tool
    for rank in (0, 1):
        rc, stdout, calls = harness.run_node("train.yaml", tmp_path / f"node{rank}", rank=rank, nodes=2)
        assert rc == 0, stdout[-2000:]
        run = calls.splitlines()
        start = next(i for i, ln in enumerate(run) if ln.startswith("start_cluster"))
        assert "searchrl train data" not in calls and "searchrl train tool-config" not in calls
        assert ("stop_cluster" in run[:start]) is (rank == 0)  # the head stops an old Ray first
        assert "ray stop" not in calls


# --- GPU_STACK=image: the image's packages are pinned too ---------------------------------------------------------


IMAGE_PYTHON = "/usr/bin/python3"  # what setup's `command -v python3` finds on the fake node's PATH


def _stand_in_image(tmp_path: Path, transformers: str) -> Path:
    """The image's packages on PYTHONPATH: a CUDA torch as trainer/node/nvidia_driver.py --torch reads it, flash-attn 2's module
    names, and verl's declared requirements with this transformers (tests/trainer/conftest.py)."""
    plain = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    if (
        subprocess.run([IMAGE_PYTHON, "-m", "pip", "--version"], capture_output=True, env=plain).returncode
        != 0
    ):
        pytest.skip("needs a /usr/bin/python3 with pip to stand in for the image's interpreter")
    site = tmp_path / "fake-torch"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text("class version:\n    cuda = '12.8'\n")
    write_flash_attn(site)
    return write_image_site(site, transformers)


def test_image_below_verls_transformers_stops_setup_before_the_long_part(tmp_path: Path) -> None:
    """verlai/verl:sgl0512.dev4 carries transformers 5.3.0; verl 0.9.1 needs >=5.5.3. `--no-deps` installed verl over
    it unchecked, so the run failed inside Ray after data prep. Now setup stops right after the verl install: one
    line, exit 2 (a refusal: trainer/node/refusal.py stops the job on the second), no data prep, no package install."""
    site = _stand_in_image(tmp_path, transformers="5.3.0")
    code, output, calls = harness.run_setup(  # type: ignore[misc]
        "train.yaml",
        tmp_path / "node",
        check=False,
        GPU_STACK="image",
        ROLLOUT="sglang",
        PYTHONPATH=str(site),
    )
    assert code == 2, output
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert errors == [
        "error: verl 0.9.1 needs what this environment does not have: transformers 5.3.0 (needs "
        "!=5.6.0,<5.11,>=5.5.3). With GPU_STACK=image pick an image that satisfies it, or use GPU_STACK=lock "
        "(requirements/, resolved for it)"
    ]
    assert "uv pip install --no-deps verl==0.9.1" in calls  # it ran after verl's install ...
    assert "-e ." not in calls and "searchrl train data" not in calls  # ... and before anything long


def test_image_setup_pins_the_images_packages_and_run_notices_a_replaced_one(tmp_path: Path) -> None:
    image_python = IMAGE_PYTHON
    plain = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    fake_torch = _stand_in_image(tmp_path, transformers="5.9.0")
    home = tmp_path / "node"
    stdout, calls = harness.run_setup(
        "train.yaml", home, attempts=1, GPU_STACK="image", ROLLOUT="sglang", PYTHONPATH=str(fake_torch)
    )
    assert "verl 0.9.1: its version ranges are met; flash-attn 2.8.3" in stdout  # the image check passed
    venv = home / "sky_workdir/.venv"
    system = subprocess.run([image_python, "-m", "pip", "freeze", "--disable-pip-version-check"], env=plain,
                            capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    system = [ln for ln in system if " @ " not in ln and not ln.startswith("-e ")]
    assert system, "the stand-in image has no packages"
    pins = (venv / "searchrl-pins.txt").read_text().splitlines()
    assert set(system) <= set(pins), sorted(set(system) - set(pins))  # `uv pip freeze` here would list none
    # start_cluster's `uv pip install "click<8.3.0"` into the venv shadows the image's copy: the run check sees it
    name, version = system[0].split("==")
    site = next((venv / "lib").glob("python3*/site-packages"))
    dist = site / f"{name.replace('-', '_')}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    env = {
        "PATH": f"{venv}/bin:/usr/bin:/bin",
        "HOME": str(home),
        "GPU_STACK": "image",
        "VIRTUAL_ENV": str(venv),
        "PYTHONPATH": str(fake_torch),  # the image's packages, as in setup (a task env: run has it too)
    }
    check = subprocess.run(["bash", str(REPO / "trainer/node/pins.sh"), "check"], cwd=home / "sky_workdir", env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 1
    assert f"error: start_cluster changed packages setup installed: {name}=={version}" in check.stderr
    shutil.rmtree(dist)
    same = subprocess.run(["bash", str(REPO / "trainer/node/pins.sh"), "check"], cwd=home / "sky_workdir", env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert same.returncode == 0, same.stderr
