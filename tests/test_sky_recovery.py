"""Managed-job recovery of the train tasks (issue 21 items 2, 4, 5, 7, 12), with SkyPilot 0.14.1's own code.

- Recovery: the task's `job_recovery` goes through `StrategyExecutor.make` (what the jobs controller calls) and
  its restart decision is `should_restart_on_failure(exit_codes)`, the controller's own call after a failed run.
  SkyPilot has no "never restart this exit code" setting (its `recover_on_exit_codes` restarts without limit), so
  trainer/refusal.py turns the same refusal twice into a clean stop; the loop below is the controller's decision
  fed with the real guard's exit codes.
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
from pathlib import Path

import pytest

from tests import test_sky_yaml as harness
from tests.conftest import REPO
from tests.sky_code import sky_json
from tests.trainer.conftest import write_flash_attn, write_image_site

GUARD = REPO / "trainer" / "refusal.py"

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


def refuse(state: Path, task_id: str | None, message: str = "EXPERIMENT_NAME=x was started with other settings",
           code: int = 2) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The guard around a step that prints `error: <message>` and exits `code` (searchrl's refusal is 2)."""
    step = f"import sys; print('error: {message}', file=sys.stderr); sys.exit({code})"
    env = {k: v for k, v in os.environ.items() if k != "SKYPILOT_TASK_ID"}
    if task_id:
        env["SKYPILOT_TASK_ID"] = task_id
    return subprocess.run(
        [sys.executable, str(GUARD), "--state", str(state), "--", sys.executable, "-c", step],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def guard(state: Path, task_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    """trainer/refusal.py with these arguments, as one attempt of managed job `task_id` runs it."""
    return subprocess.run(
        [sys.executable, str(GUARD), "--state", str(state), *args],
        env={**os.environ, "SKYPILOT_TASK_ID": task_id}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def attempts(state: Path, task_id: str, step: list[str], n: int = 6) -> tuple[list[int], str]:
    """`n` attempts of one managed job as train.yaml runs them: setup's `--check`, then the guarded step. Returns
    each attempt's exit code (what SkyPilot's controller sees) and all of their stderr."""
    codes, err = [], ""
    for _ in range(n):
        check = guard(state, task_id, "--check")
        err += check.stderr
        if check.returncode:
            codes.append(check.returncode)
            continue
        ran = guard(state, task_id, "--", *step)
        err += ran.stderr
        codes.append(ran.returncode)
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


@pytest.mark.live
def test_a_retrieval_outage_is_restarted_never_stopped(tmp_path: Path) -> None:
    """Fault 2: SkyServe's own load balancer with no READY replica (its only one being replaced) answers 503.
    Before, `searchrl health` exited 2 with the same line twice, the guard took it for a refusal and the job
    ended SUCCEEDED at step N. Now it exits 75, the guard never counts it, and SkyPilot restarts the job."""
    from tests.skyserve_lb import skyserve_load_balancer

    state = tmp_path / "refusals"
    with skyserve_load_balancer([], ready_status=503) as url:
        # the balancer tries 3 times (1 s back-off) before its 503: each attempt waits past that
        health = [sys.executable, "-m", "searchrl", "health", url, "--deadline", "5"]
        codes, err = attempts(state, "sky-managed-x_searchrl-train_9-0", health, n=4)
    assert codes == [75, 75, 75, 75], err[-2000:]
    assert "503" in err and "outage: " in err and "stopped: " not in err
    assert not list(state.glob("*"))  # nothing recorded: an outage never counts towards a stop
    decisions = controller("train.yaml", [[c] for c in codes])["decisions"]
    assert decisions == [
        True,
        True,
        True,
        False,
    ]  # restarted while restarts last, then FAILED, never SUCCEEDED


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
    """The image's packages on PYTHONPATH: a CUDA torch as trainer/driver.py --torch reads it, flash-attn 2's module
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
    line, exit 2 (a refusal: trainer/refusal.py stops the job on the second), no data prep, no package install."""
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
    check = subprocess.run(["bash", str(REPO / "trainer/pins.sh"), "check"], cwd=home / "sky_workdir", env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 1
    assert f"error: start_cluster changed packages setup installed: {name}=={version}" in check.stderr
    shutil.rmtree(dist)
    same = subprocess.run(["bash", str(REPO / "trainer/pins.sh"), "check"], cwd=home / "sky_workdir", env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert same.returncode == 0, same.stderr
