"""searchrl/deploy.py and `searchrl sky train|endpoint`: endpoint wait, flags, secrets, the dry-run task.

The SkyServe controller and the cloud cannot run here: `wait_for_endpoint` gets a scripted status function that
returns records shaped like `sky.get(sky.serve.status(name))`. Everything else is real: a live retrieval
service with auth for the health check, and SkyPilot's parser building the task the dry run prints.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from retrieval.settings import RetrievalSettings
from searchrl import deploy
from searchrl.cli.sky import _argv
from searchrl.errors import ConfigError, DeployError
from tests.conftest import REPO, TINY_CORPUS
from tests.live import free_port, serve_in_thread

TOKEN = "deploy-test-token-91ab"


class ServiceStatus(enum.Enum):  # the values of sky.serve.ServiceStatus
    CONTROLLER_INIT = "CONTROLLER_INIT"
    REPLICA_INIT = "REPLICA_INIT"
    READY = "READY"
    FAILED = "FAILED"


def scripted(*records: list[dict]) -> tuple[list[str], object]:
    calls: list[str] = []
    queue = list(records)

    def status(name: str) -> list[dict]:
        calls.append(name)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return calls, status


def test_wait_for_endpoint_polls_until_ready() -> None:
    calls, status = scripted(
        [{"name": "svc", "status": ServiceStatus.CONTROLLER_INIT, "endpoint": None}],
        [{"name": "svc", "status": ServiceStatus.REPLICA_INIT, "endpoint": "34.1.2.3:30001"}],
        [{"name": "svc", "status": ServiceStatus.READY, "endpoint": "http://34.1.2.3:30001"}],
    )
    slept: list[float] = []
    url = deploy.wait_for_endpoint("svc", interval_s=5, status_fn=status, sleep=slept.append)  # type: ignore[arg-type]
    assert url == "http://34.1.2.3:30001"
    assert calls == ["svc"] * 3 and slept == [5, 5]


def test_wait_for_endpoint_adds_a_scheme_and_fails_fast() -> None:
    _, ready = scripted([{"status": ServiceStatus.READY, "endpoint": "10.0.0.1:30001"}])
    assert deploy.wait_for_endpoint("s", status_fn=ready) == "http://10.0.0.1:30001"  # type: ignore[arg-type]
    _, none = scripted([])
    with pytest.raises(
        DeployError, match=r"no service named 'gone'.*sky serve up -n gone sky/retrieval.yaml"
    ):
        deploy.wait_for_endpoint("gone", status_fn=none)  # type: ignore[arg-type]
    _, failed = scripted([{"status": ServiceStatus.FAILED, "endpoint": None}])
    with pytest.raises(DeployError, match=r"is FAILED: see `sky serve logs s 1`"):
        deploy.wait_for_endpoint("s", status_fn=failed)  # type: ignore[arg-type]


def test_wait_for_endpoint_times_out_with_the_last_status() -> None:
    _, stuck = scripted([{"status": ServiceStatus.REPLICA_INIT, "endpoint": None}])
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    status_fn: Any = stuck
    with pytest.raises(DeployError, match=r"not READY after 30s \(last status REPLICA_INIT\)"):
        deploy.wait_for_endpoint(
            "s", timeout_s=30, interval_s=10, status_fn=status_fn, sleep=sleep, clock=lambda: now[0]
        )


def test_env_flags_and_secret_names() -> None:
    assert deploy.parse_env_flags(["A=1", "B=x=y", "A=2", "EMPTY="]) == {"A": "2", "B": "x=y", "EMPTY": ""}
    with pytest.raises(ConfigError, match="--env expects NAME=VALUE"):
        deploy.parse_env_flags(["NOEQUALS"])
    with pytest.raises(ConfigError) as info:
        deploy.secrets_from_env(["WANDB_API_KEY=hunter2"])
    assert "takes a NAME only" in str(info.value) and "hunter2" not in str(info.value)


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", "abc")
    assert deploy.secrets_from_env(["RETRIEVAL_API_KEY"]) == {"RETRIEVAL_API_KEY": "abc"}
    with pytest.raises(ConfigError, match=r"secret WANDB_API_KEY is not set: export WANDB_API_KEY=\.\.\."):
        deploy.secrets_from_env(["WANDB_API_KEY"])
    assert deploy.secrets_from_env(["WANDB_API_KEY"], required=False) == {}


def test_reexec_argv_carries_secret_names_only() -> None:
    from searchrl.cli import build_parser

    args = build_parser().parse_args(
        ["sky", "train", "--dry-run", "--env", "A=1", "--secret", "WANDB_API_KEY", "--health-deadline", "5"]
    )
    argv = _argv(args, "train", [])
    assert argv == [
        "sky",
        "train",
        "--dry-run",
        "--env",
        "A=1",
        "--secret",
        "WANDB_API_KEY",
        "--health-deadline",
        "5.0",
    ]


@pytest.mark.parametrize(
    ("argv", "verb", "positional"),
    [
        (["sky", "endpoint", "svc", "--timeout", "5"], "endpoint", ["svc"]),
        (["sky", "probe", "http://h:1", "--secret", "RETRIEVAL_API_KEY"], "probe", ["http://h:1"]),
        (["sky", "validate", "a.yaml", "b.yaml", "--env", "X=1"], "validate", ["a.yaml", "b.yaml"]),
    ],
)
def test_reexec_argv_round_trips(argv: list[str], verb: str, positional: list[str]) -> None:
    from searchrl.cli import build_parser

    parser = build_parser()
    rebuilt = _argv(parser.parse_args(argv), verb, positional)
    assert vars(parser.parse_args(rebuilt)).keys() == vars(parser.parse_args(argv)).keys()
    assert {k: str(v) for k, v in vars(parser.parse_args(rebuilt)).items() if k != "handler"} == {
        k: str(v) for k, v in vars(parser.parse_args(argv)).items() if k != "handler"
    }


def test_required_names_are_the_null_entries() -> None:
    envs, secrets = deploy.required_names(deploy.SKY_DIR / "train.yaml")
    assert envs == ["RETRIEVAL_SERVICE_URL", "CHECKPOINT_BUCKET"]
    assert secrets == ["RETRIEVAL_API_KEY"]


# --- plan_train / `searchrl sky train --dry-run` against a live service ------------------------------------------


@pytest.fixture(scope="module")
def auth_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from retrieval.app import create_app

    settings = RetrievalSettings(
        backend="bm25", corpus=str(TINY_CORPUS), data_dir=tmp_path_factory.mktemp("data"), api_key=TOKEN
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url


@pytest.mark.live
def test_train_refuses_a_dead_service_before_touching_skypilot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DeployError, match=rf"retrieval service {dead} failed its health check.*unreachable"):
        deploy.plan_train(envs={"RETRIEVAL_SERVICE_URL": dead, "CHECKPOINT_BUCKET": "b"}, health_deadline_s=1)


@pytest.mark.live
def test_train_refuses_a_wrong_token_and_missing_inputs(
    auth_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = {"RETRIEVAL_SERVICE_URL": auth_url, "CHECKPOINT_BUCKET": "b"}
    with pytest.raises(ConfigError, match="secret RETRIEVAL_API_KEY is not set"):
        deploy.plan_train(envs=envs)
    monkeypatch.setenv("RETRIEVAL_API_KEY", "wrong-token")
    with pytest.raises(DeployError, match=r"failed its health check.*401") as info:
        deploy.plan_train(envs=envs, health_deadline_s=5)
    assert "wrong-token" not in str(info.value)
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    with pytest.raises(ConfigError, match=r"train.yaml needs --env CHECKPOINT_BUCKET=\.\.\."):
        deploy.plan_train(envs={"RETRIEVAL_SERVICE_URL": auth_url})


@pytest.mark.live
def test_sky_train_dry_run_prints_the_task_with_url_and_redacted_secrets(auth_url: str) -> None:
    env = {**os.environ, "RETRIEVAL_API_KEY": TOKEN, "WANDB_API_KEY": "wandb-secret-77"}
    argv = ["sky", "train", "--dry-run", "--env", f"RETRIEVAL_SERVICE_URL={auth_url}",
            "--env", "CHECKPOINT_BUCKET=my-searchrl-ckpts", "--env", "DATASET_SIZE=small",
            "--env", "ALLOW_SMALL_CORPUS=1",  # the fixture service serves 20 passages, not wiki-18
            "--secret", "WANDB_API_KEY", "--num-nodes", "3"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "searchrl", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in (TOKEN, "wandb-secret-77"):
        assert secret not in proc.stdout and secret not in proc.stderr
    task = yaml.safe_load(proc.stdout)
    assert task["name"] == "searchrl-train" and task["num_nodes"] == 3
    assert task["resources"]["accelerators"] == {"H100": 8}
    assert task["envs"]["RETRIEVAL_SERVICE_URL"] == auth_url
    assert task["envs"]["DATASET_SIZE"] == "small" and task["envs"]["CHECKPOINT_DIR"] == "/checkpoints"
    assert task["secrets"] == {
        "RETRIEVAL_API_KEY": "<redacted>",
        "WANDB_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
    }
    assert task["file_mounts"]["/checkpoints"]["name"] == "my-searchrl-ckpts"
    assert task["file_mounts"]["/checkpoints"]["mode"] == "MOUNT_CACHED"
    assert "exec searchrl train merge" in task["run"]  # block style: the printed run: reads like the file
    assert "ok:" in proc.stderr  # the health check ran against the live service before the task was built


@pytest.mark.live
def test_sky_train_refuses_search_r1_data_against_a_small_corpus(auth_url: str) -> None:
    env = {**os.environ, "RETRIEVAL_API_KEY": TOKEN}
    argv = ["sky", "train", "--dry-run", "--env", f"RETRIEVAL_SERVICE_URL={auth_url}",
            "--env", "CHECKPOINT_BUCKET=my-searchrl-ckpts"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "searchrl", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert line.startswith("error: the retrieval service searches backend bm25, corpus ")
    assert "not wiki-18 (21,015,324 passages)" in line and "ALLOW_SMALL_CORPUS=1" in line
    assert TOKEN not in proc.stderr and not proc.stdout  # nothing printed, nothing launched


def test_module_imports_without_skypilot() -> None:
    code = "import sys; import searchrl.deploy, searchrl.cli.sky, searchrl.cli.health; print('sky' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path("/"), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
