"""The sky/ task files through SkyPilot's real parser, and sky/retrieval.yaml's readiness probe against a real
service started the way its `run:` starts it.

SkyPilot lives in `.venv-sky` (its click pin clashes with verl's deps), so the SkyPilot half runs in a
subprocess of `skypilot.sky_python()`; `searchrl sky ...` from this interpreter re-runs itself there, as users see.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from searchrl.deploy import endpoint, replica_budget, skypilot, tasks
from searchrl.errors import DeployError
from searchrl.processes import stop_process
from searchrl.retrieval.process import free_port, start_process, wait_until_ready
from tests.conftest import REPO, TINY_CORPUS
from tests.sky_code import in_sky_python

SKY = REPO / "sky"
GPU_YAMLS = {"train.yaml", "train-single.yaml", "infer.yaml"}  # setup installs a CUDA stack
YAMLS = sorted(SKY.glob("*.yaml"))
TOKEN = "probe-test-token-5c1f"


def searchrl(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m searchrl ...` from the test interpreter (re-runs itself with SkyPilot's python if needed)."""
    return subprocess.run(
        [sys.executable, "-m", "searchrl", *argv],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- static checks of the files (no SkyPilot needed) ------------------------------------------------------------


def test_the_four_task_files_exist_and_sky_is_not_a_python_package() -> None:
    assert [p.name for p in tasks.task_files()] == list(skypilot.TASK_FILES)
    assert not list(SKY.glob("*.py")), "sky/ holds YAML only: a sky/__init__.py would shadow SkyPilot"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_header_has_purpose_requirements_and_usage_with_existing_paths(path: Path) -> None:
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert len(header) > 5 and header[0].startswith("# ") and len(header[0]) > 20
    assert "# Requirements:" in text and "# Usage" in text
    assert re.search(r"sky (serve )?down|sky jobs cancel", text), "usage must end with how to tear down"
    for ref in sorted(set(re.findall(r"\b((?:sky|docs|tests)/[\w./-]+\.(?:yaml|md|jsonl))", text))):
        assert (REPO / ref).is_file(), f"{path.name} header points at missing {ref}"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_knob_is_commented_and_secrets_carry_no_values(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    lines = path.read_text().splitlines()
    for section in ("envs", "secrets"):
        for key in config.get(section) or {}:
            (line,) = [ln for ln in lines if ln.startswith(f"  {key}:")]
            assert "  # " in line, (
                f"{path.name}: {section}.{key} needs an inline comment (Required/Optional, units)"
            )
    for key, value in (config.get("secrets") or {}).items():
        assert value in (None, ""), f"{path.name}: secret {key} must be null or empty (pass with --secret)"
        assert "--secret " + key in path.read_text()


def test_train_yaml_follows_the_multinode_rules() -> None:
    config = yaml.safe_load((SKY / "train.yaml").read_text())
    run, setup = config["run"], config["setup"]
    assert config["num_nodes"] == 2 and config["resources"]["accelerators"] == "H100:8"
    assert "~/sky_templates/ray/start_cluster" in run and config["envs"]["RAY_DASHBOARD_HOST"] == "127.0.0.1"
    assert 'searchrl health "$RETRIEVAL_SERVICE_URL"' in run
    assert run.index("searchrl health") < run.index("searchrl train local")
    assert "searchrl train merge" not in run  # sky/merge.yaml, on a CPU node: no 16 GPUs wait for it
    assert "ray.init" not in run and "address=auto" not in run
    # installs exactly the lock (tests/trainer/test_lockfiles.py checks every install line)
    assert 'uv pip install --require-hashes -r "requirements/gpu-${ROLLOUT}-py311.txt"' in setup
    assert config["file_mounts"]["/checkpoints"]["name"] == "$CHECKPOINT_BUCKET"
    assert config["envs"]["CHECKPOINT_DIR"] == "/checkpoints"
    assert config["envs"]["RETRIEVAL_SERVICE_URL"] is None  # taken at launch, never baked in


def test_retrieval_yaml_runs_the_server_in_the_foreground() -> None:
    run = yaml.safe_load((SKY / "retrieval.yaml").read_text())["run"]
    assert re.search(r"^exec searchrl serve\b", run, re.M)
    assert "&" not in run.replace("&&", "")


# --- SkyPilot's parser ------------------------------------------------------------------------------------------


def test_validate_passes_on_the_shipped_yamls() -> None:
    proc = searchrl("sky", "validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    oks = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok ")]
    assert len(oks) == len(skypilot.TASK_FILES), proc.stdout
    assert "--secret RETRIEVAL_API_KEY" in proc.stdout  # what the launch still needs is reported


def _broken_copies(tmp: Path) -> dict[str, Path]:
    retrieval = (SKY / "retrieval.yaml").read_text()
    train = (SKY / "train.yaml").read_text()
    variants = {
        "misspelled.yaml": retrieval.replace("readiness_probe:", "readines_probe:"),
        "missing-secret.yaml": retrieval.replace("  RETRIEVAL_API_KEY: null", "  OTHER_TOKEN: null"),
        "bad-accelerator.yaml": train.replace("H100:8", "H1000:8"),
        "inline-secret.yaml": train.replace('  WANDB_API_KEY: ""', "  WANDB_API_KEY: abc123"),
    }
    out = {}
    for name, text in variants.items():
        assert text != (SKY / "train.yaml").read_text() and text != retrieval
        (tmp / name).write_text(text)
        out[name] = tmp / name
    return out


def test_validate_fails_clearly_on_broken_copies(tmp_path: Path) -> None:
    files = _broken_copies(tmp_path)
    proc = searchrl("sky", "validate", *map(str, files.values()))
    assert proc.returncode == 2
    fails = {
        Path(ln.split()[1].rstrip(":")).name: ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL")
    }
    assert set(fails) == set(files), proc.stdout
    assert "did you mean 'readiness_probe'" in fails["misspelled.yaml"]
    assert (
        "$RETRIEVAL_API_KEY" in fails["missing-secret.yaml"]
        and "--secret RETRIEVAL_API_KEY" in fails["missing-secret.yaml"]
    )
    assert "'H1000'" in fails["bad-accelerator.yaml"] and "allow-list" in fails["bad-accelerator.yaml"]
    assert "secret WANDB_API_KEY has a value in the file" in fails["inline-secret.yaml"]
    assert "abc123" not in proc.stdout + proc.stderr
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith("error: 4 of 4 task files invalid")


# --- the readiness probe against a real service started like `run:` ---------------------------------------------


@pytest.fixture
def service_like_run(tmp_path: Path) -> Iterator[tuple[str, dict]]:
    """Start sky/retrieval.yaml's `run:` script (SkyPilot-parsed, with env/secret overrides) on a free port."""
    port = free_port()
    overrides = {
        "SEARCHRL_RETRIEVAL_BACKEND": "bm25",  # fast to build over the 20-passage fixture
        "SEARCHRL_RETRIEVAL_CORPUS": str(TINY_CORPUS.relative_to(REPO)),
        "SEARCHRL_RETRIEVAL_DATA_DIR": str(tmp_path / "data"),
        "SEARCHRL_RETRIEVAL_HOST": "127.0.0.1",  # the YAML's 0.0.0.0 is for SkyServe; tests stay on loopback
        "SEARCHRL_RETRIEVAL_PORT": str(port),
    }
    parsed = json.loads(
        in_sky_python(
            "import json, os; from pathlib import Path; from searchrl.deploy import endpoint, tasks\n"
            f"envs = {overrides!r}\n"
            "t = tasks.load_task(Path('sky/retrieval.yaml'), envs, {'RETRIEVAL_API_KEY': os.environ['TOKEN']})\n"
            "p = endpoint.readiness_probe(t)\n"
            "print(json.dumps({'run': t.run, 'envs': t.envs, 'method': p.method, 'path': p.path,\n"
            "                  'post_data': p.post_data, 'headers': p.headers, 'timeout': p.timeout_s}))",
            env={"TOKEN": TOKEN},
        )
    )
    env = {**os.environ, **parsed["envs"], "RETRIEVAL_API_KEY": TOKEN}  # SkyPilot exports envs and secrets
    log_path = tmp_path / "service.log"
    base = f"http://127.0.0.1:{port}"
    proc = start_process(["bash", "-c", parsed["run"]], log_path, env=env, cwd=REPO)
    try:
        wait_until_ready(base, proc, timeout_s=90, log_path=log_path)
        yield base, parsed
    finally:
        stop_process(proc, grace_s=20)


@pytest.mark.live
def test_readiness_probe_gets_200_from_a_service_started_like_run(service_like_run: tuple[str, dict]) -> None:
    base, parsed = service_like_run
    assert parsed["run"].count("exec searchrl serve") == 1
    assert parsed["method"] == "POST" and parsed["path"] == "/ready"
    assert parsed["headers"] == {"Authorization": f"Bearer {TOKEN}"}  # the secret, substituted by SkyPilot
    # exactly what SkyServe sends: requests.post(url + path, json=post_data, headers=headers, timeout=...)
    probe = dict(json=parsed["post_data"], timeout=parsed["timeout"])
    ok = httpx.post(base + parsed["path"], headers=parsed["headers"], **probe)
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"ready": True, "detail": "ok"}  # index loaded, worker alive, queue not saturated
    # the header matters: the same probe with another token is refused, so a missing secret would never pass
    wrong = httpx.post(base + parsed["path"], headers={"Authorization": "Bearer nope"}, **probe)
    assert wrong.status_code == 401
    # and the CLI that sends it from SkyPilot's parsed task (value by NAME from the environment, never argv)
    cli = searchrl("sky", "probe", base, "--secret", "RETRIEVAL_API_KEY", env={"RETRIEVAL_API_KEY": TOKEN})
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == "POST /ready -> 200"
    assert TOKEN not in cli.stdout + cli.stderr
    forgot = searchrl("sky", "probe", base)  # no --secret: SkyPilot would leave the header as literal text
    assert forgot.returncode == 2
    assert "literal service: $RETRIEVAL_API_KEY: pass --secret RETRIEVAL_API_KEY" in forgot.stderr


# --- each node's run script as SkyPilot builds it, with its MOUNT_CACHED flush loop ------------------------------
# SkyPilot's own generator: `TaskCodeGen.build_task_bash_script` (the run section, prefixed with the Ray env unset
# and followed by `get_rclone_flush_script()`), wrapped by `log_lib.make_task_bash_script` (cd ~/sky_workdir,
# exports) and run as `/bin/bash -i <file>`, as `run_bash_command_with_log` does on every node.
BUILD_SCRIPT = r"""
import json, sys
from pathlib import Path
from sky.backends.task_codegen import UNSET_RAY_ENV_VARS, TaskCodeGen
from sky.skylet import log_lib
from searchrl.deploy import skypilot, tasks

path, rank, nodes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
need_envs, need_secrets = tasks.required_names(path)
task = tasks.load_task(path, {n: "placeholder" for n in need_envs}, {n: "secret" for n in need_secrets})
body = TaskCodeGen.build_task_bash_script(task.run, env_prefix=" && ".join(f"unset {v}" for v in UNSET_RAY_ENV_VARS))
env = {**task.envs_and_secrets, "SKYPILOT_NODE_RANK": rank, "SKYPILOT_NUM_NODES": nodes,
       "SKYPILOT_NODE_IPS": "\n".join(f"10.0.0.{i + 1}" for i in range(nodes)), "SKYPILOT_NUM_GPUS_PER_NODE": 8}
print(json.dumps({"script": log_lib.make_task_bash_script(body, env_vars=env),
                  "mount_cached": [d for d, s in (task.storage_mounts or {}).items() if s.mode.value == "MOUNT_CACHED"]}))
"""

# Commands the run sections call, stubbed: each logs its argv to $HOME/calls.log. `sleep` returns at once; the
# flush loop's `sleep 10` marks the fake rclone log uploaded on its second call. `ray health-check` answers for
# HEAD_RAY_CHECKS calls (the head's Ray alive), then fails (gone).
STUBS = {
    "searchrl": 'echo "searchrl $*" >> "$HOME/calls.log"; [ "$*" != "${FAIL_ON:-}" ] || exit 7',
    "python": 'echo "python $*" >> "$HOME/calls.log"',
    "curl": 'echo "curl $*" >> "$HOME/calls.log"',
    "findmnt": 'echo "/checkpoints bucket:my-ckpts fuse.rclone rw"',
    "uv": 'echo "uv $*" >> "$HOME/calls.log"; [ "$1 $2" != "pip freeze" ] || cat "$HOME/sky_workdir/.venv/searchrl-pins.txt"',
    "ray": (
        'echo "ray $*" >> "$HOME/calls.log"\n'
        'if [ "$1" = health-check ]; then n=$(grep -c "^ray health-check" "$HOME/calls.log");'
        ' [ "$n" -le "${HEAD_RAY_CHECKS:-0}" ] || exit 1; fi'
    ),
    "sleep": (
        'echo "sleep $*" >> "$HOME/calls.log"\n'
        'if [ "$1" = 10 ] && [ "$(grep -c "^sleep 10$" "$HOME/calls.log")" -ge 2 ]; then\n'
        '  echo "2026/11/23 12:00:00 INFO  : vfs cache: cleaned: objects 40 (was 40) in use 0, to upload 0, '
        'uploading 0, total size 6.1Gi (was 6.1Gi)" >> "$HOME"/.sky/rclone_log/*.log\nfi'
    ),
}


NODE_HELPERS = (
    "refusal.py",
    "pins.sh",
    "stack_check.py",
    "flash_switch.py",
)  # trainer/node/ scripts the train tasks' setup and run call on a node


def run_node(
    yaml_name: str,
    home: Path,
    *,
    rank: int = 0,
    nodes: int = 1,
    mount_cached: str = "/checkpoints",
    **env: str,
) -> tuple[int, str, str]:
    """Build `yaml_name`'s script for node `rank` with SkyPilot's codegen, run it in a fake node at `home`."""
    built = json.loads(_codegen(BUILD_SCRIPT, yaml_name, str(rank), str(nodes)))
    assert built["mount_cached"] == [mount_cached]
    bin_dir = home / "bin"
    for folder in (
        bin_dir,
        home / "sky_workdir/.venv/bin",
        home / ".sky/rclone_log",
        home / "sky_templates/ray",
    ):
        folder.mkdir(parents=True, exist_ok=True)
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    start = home / "sky_templates/ray/start_cluster"
    start.write_text('#!/bin/bash\necho "start_cluster UV_OVERRIDE=$UV_OVERRIDE" >> "$HOME/calls.log"\n')
    start.chmod(0o755)
    stop = home / "sky_templates/ray/stop_cluster"
    stop.write_text('#!/bin/bash\necho "stop_cluster" >> "$HOME/calls.log"\n')
    stop.chmod(0o755)
    (home / "sky_workdir/.venv/bin/activate").write_text("")
    (home / "sky_workdir/trainer/node").mkdir(parents=True, exist_ok=True)
    for helper in NODE_HELPERS:  # what the run sections call from the synced workdir
        shutil.copy(REPO / "trainer" / "node" / helper, home / "sky_workdir" / "trainer" / "node" / helper)
    (home / "sky_workdir/.venv/searchrl-pins.txt").write_text("click==8.5.1\nray==2.60.0\n")
    # A real-sized rclone log (≈200 KB, more than a pipe buffer): `tac | grep -m 1` then really gets SIGPIPE.
    lines = [
        f"2026/11/23 11:59:0{i % 10} INFO  : global_step_1005/actor/model_world_size_16_rank_{i % 16}.pt: vfs cache: "
        "queuing for upload in 5s"
        for i in range(2000)
    ]
    lines.append(
        "2026/11/23 11:59:59 INFO  : vfs cache: cleaned: objects 40 (was 40) in use 0, to upload 3, uploading 2"
    )
    (home / ".sky/rclone_log/5f1c.log").write_text("\n".join(lines) + "\n")
    # The run sections end with `trap 'kill $(jobs -p) ...' EXIT`; every stub here exits at once, so the fake node
    # waits for its background jobs instead (the interactive shell reads this): on a loaded machine the trap killed
    # infer.yaml's backgrounded `searchrl serve ... &` before its stub had logged the call.
    (home / ".bashrc").write_text("kill() { wait; }\n")
    script = home / "run.sh"
    script.write_text(built["script"])
    proc = subprocess.run(
        ["/bin/bash", "-i", str(script)],
        env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    calls = (home / "calls.log").read_text() if (home / "calls.log").is_file() else ""
    return proc.returncode, proc.stdout, calls


def _flushed(stdout: str) -> bool:
    return (
        "skypilot: cached mount is still uploading" in stdout
        and "skypilot: cached mount upload complete" in stdout
    )


@pytest.mark.parametrize(
    ("yaml_name", "last"),
    [
        ("train.yaml", "searchrl train local"),
        ("train-single.yaml", "searchrl train merge"),
        ("merge.yaml", "searchrl train merge"),
        ("infer.yaml", "searchrl compare"),
    ],
)
def test_head_run_script_exits_0_after_the_flush_loop(yaml_name: str, last: str, tmp_path: Path) -> None:
    rc, stdout, calls = run_node(yaml_name, tmp_path, nodes=2 if yaml_name == "train.yaml" else 1)
    assert rc == 0, stdout[-2000:]
    assert _flushed(stdout), stdout[-2000:]
    assert calls.splitlines()[-1].startswith("sleep 10")  # the flush loop ran after the last command
    assert calls.index(last) < calls.index("sleep 10")
    if yaml_name.startswith("train"):
        assert "start_cluster UV_OVERRIDE=" in calls and "searchrl-pins.txt" in calls
    if yaml_name == "train.yaml":
        assert (
            calls.index("searchrl train local") < calls.rindex("stop_cluster") < calls.index("sleep 10")
        )  # the exit trap


def test_index_build_copies_into_the_bucket_then_waits_for_the_upload(tmp_path: Path) -> None:
    """sky/index-build.yaml's run as SkyPilot builds it: build, copy into the MOUNT_CACHED bucket, flush loop."""
    rc, stdout, calls = run_node("index-build.yaml", tmp_path, mount_cached="/searchrl-index")
    assert rc == 0, stdout[-2000:]
    assert _flushed(stdout), stdout[-2000:]
    build = "searchrl index build --backend bm25 --corpus bundled --encoder bundled-minilm --index-type Flat"
    copy = (
        "searchrl index copy --from data --to /searchrl-index --backend bm25 --corpus bundled "
        "--encoder bundled-minilm --index-type Flat"
    )
    assert calls.index(build) < calls.index(copy) < calls.index("sleep 10")
    assert calls.splitlines()[-1].startswith("sleep 10")  # the copy is only done once rclone has uploaded it


def test_index_convert_is_a_cpu_task_that_converts_then_copies_into_the_bucket(tmp_path: Path) -> None:
    """sky/index-convert.yaml (issue 48): SkyPilot's parser accepts it with no accelerators, and its run downloads
    the Flat index, converts it, copies the result into the MOUNT_CACHED bucket, then waits for the upload."""
    path = SKY / "index-convert.yaml"
    out = in_sky_python(
        "import json, sys\n"
        "from pathlib import Path\n"
        "from searchrl.deploy import tasks\n"
        "report = tasks.validate_file(Path(sys.argv[1]))\n"
        "task = tasks.load_task(Path(sys.argv[1]), {'SEARCHRL_INDEX_BUCKET': 'my-index'})\n"
        "print(json.dumps({'problems': report.problems, 'needs': report.needs,\n"
        "    'accelerators': [r.accelerators for r in task.resources],\n"
        "    'cpus': [r.cpus for r in task.resources], 'memory': [r.memory for r in task.resources]}))\n",
        str(path),
    )
    parsed = json.loads(out.strip().splitlines()[-1])
    assert parsed["problems"] == [] and parsed["needs"] == ["--env SEARCHRL_INDEX_BUCKET"]
    assert parsed["accelerators"] == [None] and parsed["cpus"] == ["16+"] and parsed["memory"] == ["64+"]
    rc, stdout, calls = run_node("index-convert.yaml", tmp_path, mount_cached="/searchrl-index")
    assert rc == 0 and _flushed(stdout), stdout[-2000:]
    steps = [
        "searchrl index download wiki18\n",
        "searchrl index download wiki18-e5-index",
        "searchrl index convert --corpus wiki18 --encoder intfloat/e5-base-v2 --index-type IVF16384,SQ8 --data-dir data",
        "searchrl index copy --from data --to /searchrl-index --backend dense --corpus wiki18 "
        "--encoder intfloat/e5-base-v2 --index-type IVF16384,SQ8",
        "sleep 10",
    ]
    at = [calls.index(step) for step in steps]
    assert at == sorted(at), calls
    assert calls.splitlines()[-1].startswith("sleep 10")
    # a failed conversion (recall below the bar: exit 2) copies nothing and fails the job, after the flush loop
    rc, stdout, calls = run_node(
        "index-convert.yaml",
        tmp_path / "failed",
        mount_cached="/searchrl-index",
        FAIL_ON=steps[2].removeprefix("searchrl "),
    )
    assert rc != 0 and _flushed(stdout) and "searchrl index copy" not in calls


def test_a_failed_index_copy_fails_the_build_job(tmp_path: Path) -> None:
    failing = (
        "index copy --from data --to /searchrl-index --backend bm25 --corpus bundled --encoder bundled-minilm "
        "--index-type Flat"
    )
    rc, stdout, _ = run_node("index-build.yaml", tmp_path, mount_cached="/searchrl-index", FAIL_ON=failing)
    assert rc == 7 and _flushed(stdout)  # what was written still uploads; the job is still a failure


def test_worker_stays_until_the_heads_ray_is_gone_then_flushes(tmp_path: Path) -> None:
    rc, stdout, calls = run_node("train.yaml", tmp_path, rank=1, nodes=2, HEAD_RAY_CHECKS="4")
    assert rc == 0, stdout[-2000:]
    assert "searchrl train local" not in calls and "searchrl train merge" not in calls
    checks = [ln for ln in calls.splitlines() if ln.startswith("ray health-check")]
    assert checks[0] == "ray health-check --address 10.0.0.1:6379"
    assert len(checks) == 4 + 3  # alive 4 times, then 3 misses in a row before it leaves
    assert "head's Ray at 10.0.0.1:6379 is gone" in stdout
    assert _flushed(stdout) and calls.splitlines()[-1].startswith("sleep 10")


def test_a_failed_head_still_flushes_and_reports_the_failure(tmp_path: Path) -> None:
    rc, stdout, calls = run_node("train.yaml", tmp_path, nodes=2, FAIL_ON="train local")
    assert rc == 7  # the trainer's exit code is the job's
    assert "searchrl train merge" not in calls
    assert "stop_cluster" in calls  # workers see the head's Ray go and end (and flush) too
    assert "ray stop" not in calls  # it would kill SkyPilot's own Ray (6380) and the job with it
    assert _flushed(stdout)


def test_the_harness_catches_a_run_that_ends_under_pipefail(tmp_path: Path) -> None:
    """The old run sections (`set -euo pipefail` at top level, `exec` at the end) through the same harness."""
    old = (SKY / "infer.yaml").read_text()
    body = old[old.index("run: |") :]
    broken = body.replace("  (\n  set -euo pipefail", "  set -euo pipefail").replace("\n  )\n", "\n")
    (tmp_path / "sky").mkdir()
    (tmp_path / "sky/infer.yaml").write_text(old.replace(body, broken))
    rc, stdout, _ = run_node(str(tmp_path / "sky/infer.yaml"), tmp_path / "node")
    assert rc == 141 and "upload complete" not in stdout  # SIGPIPE from `tac | grep -m 1` under pipefail


# --- setup re-runs on a restarted cluster or a recovered job ----------------------------------------------------
BUILD_SETUP = r"""
import json, sys
from pathlib import Path
from sky.skylet import log_lib
from searchrl.deploy import tasks

path, overrides = Path(sys.argv[1]), json.loads(sys.argv[2])
need_envs, need_secrets = tasks.required_names(path)
envs = {**{n: "placeholder" for n in need_envs}, **overrides}
task = tasks.load_task(path, envs, {n: "secret" for n in need_secrets})
mounts = {d: {"mode": s.mode.value, "name": s.name, "source": s.source,
              "read_only": bool(s.mount_config and s.mount_config.read_only)}
          for d, s in (task.storage_mounts or {}).items()}
# RayCodeGen.add_setup prefixes the command like this, and run_bash_command_with_log wraps it the same way as run.
print(json.dumps({"setup": log_lib.make_task_bash_script("unset CUDA_VISIBLE_DEVICES; " + task.setup,
                                                         env_vars=task.envs_and_secrets),
                  "run": log_lib.make_task_bash_script(task.run, env_vars=task.envs_and_secrets),
                  "mounts": mounts}))
"""


def real_uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    assert Path(found).is_file(), "uv is a dev dependency (pyproject [dev]): pip install uv"
    return found


def built_setup(yaml_name: str, **envs: str) -> dict[str, Any]:
    """sky/<yaml_name>'s setup and run scripts and storage mounts, as SkyPilot builds them with these --env's."""
    built: dict[str, Any] = json.loads(_codegen(BUILD_SETUP, yaml_name, json.dumps(envs, sort_keys=True)))
    return built


@functools.cache
def _built(code: str, yaml_name: str, yaml_text: str, *argv: str) -> str:
    del yaml_text  # part of the key only: a changed task file is built again
    return in_sky_python(code, str(SKY / yaml_name), *argv).strip().splitlines()[-1]


def _codegen(code: str, yaml_name: str, *argv: str) -> str:
    """The JSON line SkyPilot's codegen printed for sky/<yaml_name> with these arguments, built once per test run.

    Each build starts SkyPilot's python (~5 s) and gives the same script for the same task file and arguments, so
    the tests that run one built script in several fake nodes share it (the scripts are run fresh every time)."""
    return _built(code, yaml_name, (SKY / yaml_name).read_text(), *argv)


def run_setup(
    yaml_name: str,
    home: Path,
    *,
    attempts: int = 2,
    image: bool = False,
    check: bool = True,
    rc: int = 0,
    script: str | None = None,
    **envs: str,
) -> tuple[str, str]:
    """Run the setup script `attempts` times in a fake node at `home`; returns (last stdout, calls log), and
    leaves the last stderr in `home`/setup.err. Each run must exit `rc`.
    `check=False`: one attempt that may fail; returns (its exit code, stdout and stderr, calls log) instead.

    Real `uv venv` on the same folder each time; installs, downloads and `searchrl` are stubs that log their argv.
    `searchrl` is on PATH only inside the venv, as after `uv pip install -e .`, unless `image` (an image_id that
    already has it, where setup must install nothing). `script`: a setup script built already (built_setup's
    "setup"), run instead of building one with `envs` (SkyPilot's codegen takes seconds).
    """
    if script is None:
        script = built_setup(yaml_name, **envs)["setup"]
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    (home / "sky_workdir").mkdir()
    # What SkyPilot syncs from the workdir that setup reads before anything is installed: the driver check and
    # the locks (a fake nvidia-smi reports a driver new enough for them).
    (home / "sky_workdir" / "trainer" / "node").mkdir(parents=True)
    for helper in ("nvidia_driver.py", *NODE_HELPERS):
        shutil.copy(REPO / "trainer" / "node" / helper, home / "sky_workdir" / "trainer" / "node" / helper)
    shutil.copytree(REPO / "requirements", home / "sky_workdir" / "requirements")
    # and the standard-library corpus gate the train tasks run first (python3 -m searchrl.corpus_gate)
    shutil.copytree(
        REPO / "searchrl", home / "sky_workdir" / "searchrl", ignore=shutil.ignore_patterns("__pycache__")
    )
    searchrl_stub = '#!/bin/bash\necho "searchrl $*" >> "$HOME/calls.log"\n'
    stubs = {
        # the real `uv venv` minus --seed (which would fetch pip from PyPI): re-running is about the folder; then
        # the venv gets the searchrl stub, as `uv pip install -e .` would put the real one there
        "uv": f'echo "uv $*" >> "$HOME/calls.log"\n'
        f'if [ "$1" = venv ]; then {real_uv()} ${{@/--seed/}} || exit $?\n'
        f'  cp "{bin_dir}/../searchrl-stub" "$HOME/sky_workdir/.venv/bin/searchrl"; exit 0; fi\n'
        '[ "$1 $2" != "pip freeze" ] || echo "click==8.5.1"',
        "pip": 'echo "pip $*" >> "$HOME/calls.log"',
        "pkill": 'echo "pkill $*" >> "$HOME/calls.log"',  # never the real one: it would look at this machine
        "nvidia-smi": "echo 580.95.05",
    }
    (home / "searchrl-stub").write_text(searchrl_stub)
    (home / "searchrl-stub").chmod(0o755)
    if image:
        shutil.copy(home / "searchrl-stub", bin_dir / "searchrl")
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (home / "setup.sh").write_text(script)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "UV_CACHE_DIR": str(home / "uv-cache")}
    stdout = ""
    for attempt in range(1, attempts + 1):
        proc = subprocess.run(["/bin/bash", "-i", str(home / "setup.sh")], env=env, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
        if not check:
            calls = (home / "calls.log").read_text() if (home / "calls.log").is_file() else ""
            return proc.returncode, proc.stdout + proc.stderr, calls  # type: ignore[return-value]
        assert proc.returncode == rc, (
            f"setup run {attempt} exited {proc.returncode}:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"
        )
        stdout = proc.stdout
        (home / "setup.err").write_text(proc.stderr)
    calls = (home / "calls.log").read_text() if (home / "calls.log").is_file() else ""
    return stdout, calls


@pytest.mark.parametrize("yaml_name", [p.name for p in YAMLS])
def test_setup_runs_twice_on_the_same_node(yaml_name: str, tmp_path: Path) -> None:
    """Real `uv venv` on the same folder twice; installs and downloads are stubbed (no network, no GPU wheels)."""
    # infer.yaml checks the trained model's folder first: an HF id stands in for the bucket's merged folder
    model = {"TRAINED_MODEL": "Qwen/Qwen2.5-3B-Instruct"} if yaml_name == "infer.yaml" else {}
    stdout, calls = run_setup(yaml_name, tmp_path, **model)
    venv = tmp_path / "sky_workdir" / ".venv"
    assert (venv / "bin" / "python").exists()
    assert calls.count("uv venv") == 2 and calls.count("uv pip install") >= 2
    if yaml_name in GPU_YAMLS:  # the driver check ran first, on the system python
        assert "is new enough for CUDA 13.0 in gpu-" in stdout
    if yaml_name.startswith("train"):  # the pins start_cluster's install is held to
        assert (venv / "searchrl-pins.txt").read_text() == "click==8.5.1\n"
    if yaml_name == "retrieval.yaml":  # no index bucket: downloads/builds on the replica, as before
        budget = "searchrl sky start-budget --corpus bundled --backend bm25 --delay 2000 --index-bucket  --install pip"
        assert calls.count(budget) == 2
        assert calls.count("searchrl index build --backend bm25 --corpus bundled") == 2
        assert "searchrl index copy" not in calls
        assert "setup finished after " in stdout and "of the 2000s readiness delay" in stdout


def test_retrieval_setup_with_an_index_bucket_copies_and_never_downloads_or_builds(tmp_path: Path) -> None:
    stdout, calls = run_setup(
        "retrieval.yaml", tmp_path, SEARCHRL_INDEX_BUCKET="my-index", SEARCHRL_RETRIEVAL_CORPUS="wiki18",
        SEARCHRL_RETRIEVAL_BACKEND="dense", SEARCHRL_RETRIEVAL_ENCODER="intfloat/e5-base-v2",
        SEARCHRL_INDEX_FINGERPRINT="0123456789abcdef",
    )  # fmt: skip
    copy = (
        "searchrl index copy --from /searchrl-index --to data --backend dense --corpus wiki18 "
        "--encoder intfloat/e5-base-v2 --index-type Flat --fingerprint 0123456789abcdef"
    )
    assert calls.count(copy) == 2  # once per setup run (a re-run skips files already copied)
    assert "index download" not in calls and "index build" not in calls
    assert "--delay 2000 --index-bucket my-index --install pip" in calls
    assert "setup finished after " in stdout


def test_retrieval_setup_on_an_image_with_searchrl_installs_nothing(tmp_path: Path) -> None:
    _, calls = run_setup("retrieval.yaml", tmp_path, image=True, SEARCHRL_INDEX_BUCKET="my-index")
    assert "uv " not in calls and "pip " not in calls.replace("searchrl", "")
    assert not (tmp_path / "sky_workdir" / ".venv").exists()
    assert calls.count("--index-bucket my-index --install image") == 2
    run = built_setup("retrieval.yaml")["run"]
    assert "! command -v searchrl" in run  # run: uses the image's searchrl too, and the venv only without it


def test_the_index_bucket_mounts_read_only_only_when_set() -> None:
    """What SkyPilot's parser gives for sky/retrieval.yaml with and without SEARCHRL_INDEX_BUCKET."""
    assert built_setup("retrieval.yaml")["mounts"] == {}  # as `sky serve up` runs the file today
    named = built_setup("retrieval.yaml", SEARCHRL_INDEX_BUCKET="my-index")["mounts"]
    assert named == {
        "/searchrl-index": {"mode": "MOUNT", "name": "my-index", "source": None, "read_only": True}
    }
    url = built_setup("retrieval.yaml", SEARCHRL_INDEX_BUCKET="gs://team-indexes/wiki18")["mounts"]
    assert (
        url["/searchrl-index"]["source"] == "gs://team-indexes/wiki18" and url["/searchrl-index"]["read_only"]
    )
    # index-build.yaml's own writable mount is kept; the trainer never gets the bucket from a shared --env
    build = built_setup("index-build.yaml", SEARCHRL_INDEX_BUCKET="my-index")["mounts"]
    assert build == {
        "/searchrl-index": {"mode": "MOUNT_CACHED", "name": "my-index", "source": None, "read_only": False}
    }
    assert built_setup("train.yaml", SEARCHRL_INDEX_BUCKET="my-index")["mounts"].keys() == {"/checkpoints"}


def test_an_empty_bucket_mount_in_the_file_would_fail_at_launch(tmp_path: Path) -> None:
    """Why the mount is added in Python: SkyPilot parses an env-substituted empty source offline, then refuses it
    when it constructs the storage at launch (the same `_validate_storage_spec` check)."""
    text = (
        (SKY / "retrieval.yaml")
        .read_text()
        .replace(
            "\nenvs:\n",
            "\nfile_mounts:\n  /searchrl-index:\n    source: $SEARCHRL_INDEX_BUCKET\n    mode: MOUNT\n\nenvs:\n",
        )
    )
    (tmp_path / "retrieval.yaml").write_text(text)
    code = (
        "import sys; from pathlib import Path; from searchrl.deploy.tasks import load_task\n"
        "t = load_task(Path(sys.argv[1]), {}, {'RETRIEVAL_API_KEY': 'x'})\n"
        "(s,) = t.storage_mounts.values()\n"
        "try:\n    s._validate_storage_spec(s.name)\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    out = in_sky_python(code, str(tmp_path / "retrieval.yaml"))
    assert "StorageNameError Storage name must be specified if the source is local." in out


def test_sky_serve_dry_run_prints_the_task_with_the_mount_and_no_token() -> None:
    proc = searchrl(
        "sky", "serve", "--dry-run", "--secret", "RETRIEVAL_API_KEY", "--env", "SEARCHRL_INDEX_BUCKET=my-index",
        "--cpus", "16+", "--memory", "96+", env={"RETRIEVAL_API_KEY": TOKEN},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    task = yaml.safe_load(proc.stdout)
    mount = task["file_mounts"]["/searchrl-index"]
    assert (
        mount["mode"] == "MOUNT" and mount["config"] == {"mount": {"read_only": True}} and mount["persistent"]
    )
    assert task["resources"]["cpus"] == "16+" and task["resources"]["memory"] == "96+"
    assert TOKEN not in proc.stdout + proc.stderr
    plain = searchrl(
        "sky", "serve", "--dry-run", "--secret", "RETRIEVAL_API_KEY", env={"RETRIEVAL_API_KEY": TOKEN}
    )
    assert plain.returncode == 0 and not yaml.safe_load(plain.stdout).get("file_mounts")


def test_plain_uv_venv_fails_on_a_rerun(tmp_path: Path) -> None:
    """The control: what setup did before (`uv venv DIR` without --allow-existing/--clear) breaks a re-run."""
    cmd = [real_uv(), "venv", "-q", "--python", "3.11", str(tmp_path / ".venv")]
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "already exists" in again.stderr


def test_probe_delay_env_matches_the_probe_and_covers_the_measured_starts() -> None:
    config = yaml.safe_load((SKY / "retrieval.yaml").read_text())
    delay = config["service"]["readiness_probe"]["initial_delay_seconds"]
    assert config["envs"]["SEARCHRL_PROBE_DELAY_S"] == str(delay)
    # the recommended path: every single-backend corpus from the index bucket, with pip or an image
    for corpus in ("bundled", "wiki18-100k", "wiki18"):
        for backend in ("bm25", "dense"):
            for install in ("pip", "image"):
                line = replica_budget.start_budget(corpus, backend, delay, prebuilt=True, install=install)
                assert line.startswith("replica start: ") and "from the index bucket" in line
    # sized by the slowest of them (wiki18 dense, x1.2), not padded far beyond it
    slowest = max(v[0] for k, v in replica_budget.PREBUILT_ESTIMATES_S.items() if k[1] in ("bm25", "dense"))
    assert slowest * 1.2 <= delay < slowest * 1.2 + 60
    # without a bucket the small corpora still fit, and wiki18 is refused with the bucket path named
    for corpus, backend in [("bundled", "bm25"), ("bundled", "dense"), ("wiki18-100k", "dense")]:
        assert replica_budget.start_budget(corpus, backend, delay).startswith("replica start: ")
    with pytest.raises(
        DeployError, match=r"needs ~2898s to start downloading.*from an index bucket it needs ~1643s"
    ):
        replica_budget.start_budget("wiki18", "dense", delay)
    policy = config["service"]["replica_policy"]
    bundled_start = replica_budget.PREBUILT_ESTIMATES_S[("bundled", "bm25")][0]
    # scale up for load that lasts about as long as a new replica takes to start; keep replicas > 2 starts
    assert abs(policy["upscale_delay_seconds"] - bundled_start) < 0.1 * bundled_start
    assert policy["downscale_delay_seconds"] >= 2 * bundled_start


def test_validate_catches_a_probe_delay_env_out_of_step(tmp_path: Path) -> None:
    copy = tmp_path / "retrieval.yaml"
    copy.write_text(
        (SKY / "retrieval.yaml")
        .read_text()
        .replace("initial_delay_seconds: 2000", "initial_delay_seconds: 600")
    )
    proc = searchrl("sky", "validate", str(copy))
    assert proc.returncode == 2
    assert "SEARCHRL_PROBE_DELAY_S=2000 but readiness_probe.initial_delay_seconds is 600" in proc.stdout


def test_the_documented_tls_block_passes_skypilots_parser(tmp_path: Path) -> None:
    text = (SKY / "retrieval.yaml").read_text()
    block = "  # tls:\n  #   keyfile: ~/.searchrl/tls/key.pem\n  #   certfile: ~/.searchrl/tls/cert.pem"
    assert block in text
    (tmp_path / "key.pem").write_text("key")
    (tmp_path / "cert.pem").write_text("cert")
    enabled = text.replace(
        block, f"  tls:\n    keyfile: {tmp_path}/key.pem\n    certfile: {tmp_path}/cert.pem"
    )
    (tmp_path / "retrieval.yaml").write_text(enabled)
    proc = searchrl("sky", "validate", str(tmp_path / "retrieval.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_sky_launch_the_repo_documents_deletes_its_cluster() -> None:
    """`sky launch -c` leaves a cluster up: every one we document carries `-i N --down`, and the files it launches
    set `resources.autostop` with `down: true` for a launch that forgets the flags."""
    docs = [REPO / "README.md", REPO / "Makefile", *REPO.glob("docs/*.md"), *SKY.glob("*.md"), *YAMLS]
    launches = [
        (path.name, line)
        for path in docs
        for line in path.read_text().splitlines()
        if re.search(r"\bsky launch -c \S", line)  # a launch command (prose says `sky launch`)
    ]
    assert len(launches) >= 4, launches
    for name, line in launches:
        assert re.search(r"sky launch -c \S+ -i \d+ --down ", line), f"{name}: {line.strip()}"
    for yaml_name in (
        "train.yaml",
        "train-single.yaml",
        "merge.yaml",
        "infer.yaml",
        "index-build.yaml",
        "index-convert.yaml",
    ):
        autostop = yaml.safe_load((SKY / yaml_name).read_text())["resources"]["autostop"]
        assert autostop["down"] is True and autostop["idle_minutes"] <= 15


def test_the_endpoint_wait_outlasts_the_probe_delay() -> None:
    delay = yaml.safe_load((SKY / "retrieval.yaml").read_text())["service"]["readiness_probe"][
        "initial_delay_seconds"
    ]
    assert (
        endpoint.ENDPOINT_TIMEOUT_S >= delay + 300
    )  # a replica may use all of its delay, after provisioning


def test_the_heads_health_wait_covers_a_replica_start() -> None:
    """A resume after an outage may find SkyServe replacing a replica: the head waits as long as `searchrl sky
    endpoint` would (the probe delay plus provisioning), not 300 s, before it calls it an outage (exit 75)."""
    config = yaml.safe_load((SKY / "train.yaml").read_text())
    assert float(config["envs"]["HEALTH_DEADLINE_S"]) >= endpoint.ENDPOINT_TIMEOUT_S
    assert 'step searchrl health "$RETRIEVAL_SERVICE_URL" --deadline "$HEALTH_DEADLINE_S"' in config["run"]


REHEARSAL_PLAN = """
import json, sys
from pathlib import Path
from searchrl.deploy import tasks
from searchrl.deploy.train_settings import node_settings, task_gpus_per_node
task = tasks.load_task(Path(sys.argv[1]), json.loads(sys.argv[2]), {})
task.num_nodes = 1  # as `searchrl sky train --num-nodes 1` (train-single.yaml has one already)
(gpus,) = task_gpus_per_node(task)
s = node_settings(dict(task.envs), nnodes=1, gpus_per_node=gpus)
print(json.dumps({"env": task.envs.get("REHEARSE_MULTI_NODE"), "gpus": s.n_gpus,
                  "fsdp": [s.fsdp_strategy, s.fsdp_size, s.fsdp_replicas, s.sync_grads_per_mini_batch]}))
"""


@pytest.mark.parametrize("yaml_name", ["train.yaml", "train-single.yaml"])
def test_both_train_tasks_carry_the_one_node_rehearsal_switch_off_by_default(yaml_name: str) -> None:
    """REHEARSE_MULTI_NODE (issue 53 item 4) is a commented knob of both train tasks, "0" by default; SkyPilot's
    parser puts `--env REHEARSE_MULTI_NODE=1` in the task's envs, which the nodes' TrainSettings read: on one node
    of 8 GPUs the multi-node FSDP layout (FSDP2, no-sync, HSDP 2 x 4), without it verl's one-node default."""
    assert yaml.safe_load((SKY / yaml_name).read_text())["envs"]["REHEARSE_MULTI_NODE"] == "0"
    base = {"CHECKPOINT_BUCKET": "b", "RETRIEVAL_SERVICE_URL": "http://10.0.0.1:8000"}
    plans = [
        json.loads(in_sky_python(REHEARSAL_PLAN, str(SKY / yaml_name), json.dumps({**base, **extra})))
        for extra in ({}, {"REHEARSE_MULTI_NODE": "1"})
    ]
    assert plans[0] == {"env": "0", "gpus": 8, "fsdp": ["fsdp", -1, 1, False]}
    assert plans[1] == {"env": "1", "gpus": 8, "fsdp": ["fsdp2", 4, 2, True]}


def test_every_task_that_installs_uv_pins_the_same_version() -> None:
    """retrieval.yaml and index-build.yaml installed whatever uv PyPI had that day; the train tasks pin it."""
    found = {
        path.name: re.findall(r"pip install -q (\S+)", line)[0]
        for path in YAMLS
        for line in path.read_text().splitlines()
        if re.search(r"pip install -q \S*uv\b", line)
    }
    assert set(found) == set(skypilot.TASK_FILES)  # every task file
    assert set(found.values()) == {'"uv==0.13.9"'}, found


def test_sky_train_says_the_service_keeps_billing() -> None:
    proc = searchrl(
        "sky", "train", "--dry-run", "--env", "CHECKPOINT_BUCKET=b", "--secret", "RETRIEVAL_API_KEY",
        env={"RETRIEVAL_API_KEY": TOKEN},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "reminder: the retrieval service searchrl-retrieval (its replicas and the serve controller) keeps billing "
        "after the job ends, until `sky serve down searchrl-retrieval`" in proc.stderr
    )
    assert TOKEN not in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def bundled_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real retrieval service on loopback serving the bundled corpus (BM25, ~2 s to start). No token: the built
    setup script exports the secret redacted (SkyPilot's `envs_and_secrets`), so the node could not send one."""
    from searchrl.retrieval.serving.app import create_app
    from searchrl.retrieval.settings import RetrievalSettings
    from tests.live import serve_in_thread

    settings = RetrievalSettings(
        backend="bm25", corpus="bundled", data_dir=tmp_path_factory.mktemp("bundled")
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url


@pytest.mark.live
def test_a_by_hand_train_launch_refuses_the_bundled_service_before_installing_anything(
    bundled_service: str, tmp_path: Path
) -> None:
    """Trap (issue 38 item 5): `sky jobs launch sky/train.yaml` by hand skipped the plan's corpus check, so a
    service on the bundled 10k summaries was found only by `searchrl train local`, after the lock install, the
    data prep and Ray on 2 x 8 H100. The first check of setup now reads the service's GET / with the system python
    and refuses it (exit 2 through trainer/node/refusal.py, one line) before the driver check and any install."""
    home = tmp_path / "node"
    stdout, calls = run_setup("train.yaml", home, attempts=1, rc=2, RETRIEVAL_SERVICE_URL=bundled_service)
    err = (home / "setup.err").read_text()
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, err
    assert "corpus bundled (10,033 passages" in errors[0] and "not wiki-18" in errors[0], errors
    assert "ALLOW_SMALL_CORPUS=1" in errors[0]
    assert calls == "" and "is new enough" not in stdout  # no driver check, no uv, no pip, no searchrl
    # control: a smoke run that allows it goes on to the driver check and the install, and says what it saw
    stdout, calls = run_setup(
        "train.yaml", tmp_path / "allowed", attempts=1, RETRIEVAL_SERVICE_URL=bundled_service,
        ALLOW_SMALL_CORPUS="1",
    )  # fmt: skip
    assert "retrieval corpus: backend bm25, corpus bundled (10,033 passages" in stdout
    assert "is new enough for CUDA 13.0" in stdout and "uv venv" in calls


# --- the trained model's folder: one name, the trainer's (issue 38 item 5) --------------------------------------
MERGED = re.compile(r"/checkpoints/([A-Za-z0-9._-]+)/merged/global_step_(\d+)")


def _trained_folder(monkeypatch: pytest.MonkeyPatch) -> str:
    """Where sky/train.yaml's default run merges its last step: TrainSettings from the file's envs (the trainer's
    own default_experiment_name), then trainer/merge.py's <run>/merged/global_step_<TOTAL_STEPS>."""
    from searchrl.trainer.settings import TrainSettings

    envs = yaml.safe_load((SKY / "train.yaml").read_text())["envs"]
    for name in ("MODEL_NAME", "DATASET_SIZE", "TOTAL_STEPS", "CHECKPOINT_DIR", "EXPERIMENT_NAME"):
        monkeypatch.setenv(name, str(envs[name]))
    settings = TrainSettings()
    return f"{settings.run_dir}/merged/global_step_{settings.total_steps}"


def test_infer_and_the_docs_read_the_folder_the_trainer_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trap (issue 38 item 5): infer.yaml and the docs named `search-r1-qwen2.5-3b-grpo`, a run the trainer never
    writes (`search-r1-qwen2.5-3b-instruct-full-1005steps`); the wrong folder showed only after infer.yaml's ~48
    min wiki-18 download. infer.yaml's default folder is now the trainer's, and every documented one agrees."""
    folder = _trained_folder(monkeypatch)
    assert folder == "/checkpoints/search-r1-qwen2.5-3b-instruct-full-1005steps/merged/global_step_1005"
    infer = yaml.safe_load((SKY / "infer.yaml").read_text())["envs"]
    derived = "/checkpoints/$EXPERIMENT_NAME/merged/global_step_$TRAINED_STEP"
    assert infer["TRAINED_MODEL"] == "" and derived in (SKY / "infer.yaml").read_text()
    assert (
        derived.replace("$EXPERIMENT_NAME", infer["EXPERIMENT_NAME"]).replace(
            "$TRAINED_STEP", infer["TRAINED_STEP"]
        )
        == folder
    )
    shown = {
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in [
            REPO / "README.md",
            REPO / "sky/README.md",
            *(REPO / "docs").glob("*.md"),
            *SKY.glob("*.yaml"),
        ]
        for m in MERGED.finditer(path.read_text())
    }
    assert shown and all(s.endswith(folder) for s in shown), sorted(shown)


def test_infer_setup_stops_on_a_missing_model_folder_before_the_download(tmp_path: Path) -> None:
    """The folder is checked at the top of setup (the bucket is mounted by then): one line, exit 2, nothing
    installed or downloaded; a folder that is there goes on to the driver check and the install."""
    stdout, calls = run_setup("infer.yaml", tmp_path / "missing", attempts=1, rc=2)
    err = (tmp_path / "missing/setup.err").read_text()
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert (
        "no merged model at /checkpoints/search-r1-qwen2.5-3b-instruct-full-1005steps/merged/global_step_1005"
        in line
    )
    assert calls == "" and "is new enough" not in stdout  # no driver check, no uv, no download
    model = tmp_path / "bucket/merged/global_step_7"
    model.mkdir(parents=True)
    stdout, calls = run_setup("infer.yaml", tmp_path / "there", attempts=1, TRAINED_MODEL=str(model))
    assert (
        "is new enough for CUDA" in stdout
        and "uv venv" in calls
        and "searchrl index download wiki18" in calls
    )
