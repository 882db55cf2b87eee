"""searchrl/deploy/ and `searchrl sky train|endpoint`: endpoint wait, flags, secrets, the dry-run task.

The SkyServe controller and the cloud cannot run here: `wait_for_endpoint` gets a scripted status function that
returns records shaped like `sky.get(sky.serve.status(name))`. Everything else is real: a live retrieval
service with auth for the health check, and SkyPilot's parser building the task the dry run prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchrl.cli.sky import _argv
from searchrl.deploy import endpoint, launch, skypilot, tasks
from searchrl.errors import ConfigError, DeployError
from tests.conftest import AUTH_TOKEN, REPO
from tests.live import free_port

TOKEN = AUTH_TOKEN


def scripted(*records: list[dict]) -> tuple[list[str], object]:
    calls: list[str] = []
    queue = list(records)

    def status(name: str) -> list[dict]:
        calls.append(name)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return calls, status


def test_wait_for_endpoint_adds_a_scheme_and_fails_fast() -> None:
    _, ready = scripted([{"status": "READY", "endpoint": "10.0.0.1:30001"}])
    assert endpoint.wait_for_endpoint("s", status_fn=ready) == "http://10.0.0.1:30001"  # type: ignore[arg-type]
    _, none = scripted([])
    with pytest.raises(
        DeployError, match=r"no service named 'gone'.*sky serve up -n gone sky/retrieval.yaml"
    ):
        endpoint.wait_for_endpoint("gone", status_fn=none)  # type: ignore[arg-type]
    _, broken = scripted([{"status": "CONTROLLER_FAILED", "endpoint": None, "replica_info": []}])
    with pytest.raises(DeployError, match=r"is CONTROLLER_FAILED \(no replicas yet\).*--controller s"):
        endpoint.wait_for_endpoint("s", status_fn=broken)  # type: ignore[arg-type]


def test_wait_for_endpoint_times_out_with_the_replica_states() -> None:
    starting = {"status": "NO_REPLICA", "endpoint": None,
                "replica_info": [{"replica_id": 1, "status": "STARTING"}, {"replica_id": 2, "status": "PROVISIONING"}]}  # fmt: skip
    _, stuck = scripted([starting])
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    status_fn: Any = stuck
    with pytest.raises(
        DeployError,
        match=r"not READY after 30s \(last status NO_REPLICA; replicas: 1 PROVISIONING, 1 STARTING\)",
    ):
        endpoint.wait_for_endpoint(
            "s", timeout_s=30, interval_s=10, status_fn=status_fn, sleep=sleep, clock=lambda: now[0]
        )


def test_env_flags_and_secret_names() -> None:
    assert tasks.parse_env_flags(["A=1", "B=x=y", "A=2", "EMPTY="]) == {"A": "2", "B": "x=y", "EMPTY": ""}
    with pytest.raises(ConfigError, match="--env expects NAME=VALUE"):
        tasks.parse_env_flags(["NOEQUALS"])
    with pytest.raises(ConfigError) as info:
        tasks.secrets_from_env(["WANDB_API_KEY=hunter2"])
    assert "takes a NAME only" in str(info.value) and "hunter2" not in str(info.value)


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", "abc")
    assert tasks.secrets_from_env(["RETRIEVAL_API_KEY"]) == {"RETRIEVAL_API_KEY": "abc"}
    with pytest.raises(ConfigError, match=r"secret WANDB_API_KEY is not set: export WANDB_API_KEY=\.\.\."):
        tasks.secrets_from_env(["WANDB_API_KEY"])
    assert tasks.secrets_from_env(["WANDB_API_KEY"], required=False) == {}


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
    envs, secrets = tasks.required_names(skypilot.SKY_DIR / "train.yaml")
    assert envs == ["RETRIEVAL_SERVICE_URL", "CHECKPOINT_BUCKET"]
    assert secrets == ["RETRIEVAL_API_KEY"]


# --- plan_train / `searchrl sky train --dry-run` against a live service ------------------------------------------


@pytest.fixture(scope="module")
def auth_url(authed_bm25_url: str) -> str:
    return authed_bm25_url


@pytest.mark.live
def test_train_refuses_a_dead_service_before_touching_skypilot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DeployError, match=rf"retrieval service {dead} failed its health check.*unreachable"):
        launch.plan_train(envs={"RETRIEVAL_SERVICE_URL": dead, "CHECKPOINT_BUCKET": "b"}, health_deadline_s=1)


@pytest.mark.live
def test_train_refuses_a_wrong_token_and_missing_inputs(
    auth_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = {"RETRIEVAL_SERVICE_URL": auth_url, "CHECKPOINT_BUCKET": "b"}
    with pytest.raises(ConfigError, match="secret RETRIEVAL_API_KEY is not set"):
        launch.plan_train(envs=envs)
    monkeypatch.setenv("RETRIEVAL_API_KEY", "wrong-token")
    with pytest.raises(DeployError, match=r"failed its health check.*401") as info:
        launch.plan_train(envs=envs, health_deadline_s=5)
    assert "wrong-token" not in str(info.value)
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    with pytest.raises(ConfigError, match=r"train.yaml needs --env CHECKPOINT_BUCKET=\.\.\."):
        launch.plan_train(envs={"RETRIEVAL_SERVICE_URL": auth_url})


def _resource(task: dict, key: str) -> object:
    """A resources field of a printed task: at the top, or the same in every `any_of` alternative."""
    resources = task["resources"]
    if key in resources:
        return resources[key]
    values = [alt.get(key) for alt in resources["any_of"]]
    assert values and all(v == values[0] for v in values), values
    return values[0]


@pytest.mark.live
def test_sky_train_dry_run_prints_the_task_with_url_and_redacted_secrets(auth_url: str) -> None:
    env = {**os.environ, "RETRIEVAL_API_KEY": TOKEN, "WANDB_API_KEY": "wandb-secret-77"}
    argv = ["sky", "train", "--dry-run", "--env", f"RETRIEVAL_SERVICE_URL={auth_url}",
            "--env", "CHECKPOINT_BUCKET=my-searchrl-ckpts", "--env", "DATASET_SIZE=small",
            "--env", "ALLOW_SMALL_CORPUS=1",  # the fixture service serves 20 passages, not wiki-18
            "--secret", "WANDB_API_KEY", "--num-nodes", "4"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "searchrl", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in (TOKEN, "wandb-secret-77"):
        assert secret not in proc.stdout and secret not in proc.stderr
    task = yaml.safe_load(proc.stdout)
    assert task["name"] == "searchrl-train" and task["num_nodes"] == 4
    assert _resource(task, "accelerators") == {"H100": 8}
    # one cloud whose default image has the 580 driver (issue 34), the one its checkpoint bucket is created in
    assert "any_of" not in task["resources"] and "ordered" not in task["resources"], task["resources"]
    assert str(task["resources"].get("infra", task["resources"].get("cloud"))).lower() == "aws"
    assert task["envs"]["RETRIEVAL_SERVICE_URL"] == auth_url
    assert task["envs"]["DATASET_SIZE"] == "small" and task["envs"]["CHECKPOINT_DIR"] == "/checkpoints"
    assert task["secrets"] == {
        "RETRIEVAL_API_KEY": "<redacted>",
        "WANDB_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
    }
    assert task["file_mounts"]["/checkpoints"]["name"] == "my-searchrl-ckpts"
    assert task["file_mounts"]["/checkpoints"]["mode"] == "MOUNT_CACHED"
    assert "\nstep searchrl health" in task["run"]  # block style: the printed run: reads like the file
    assert "then sky/merge.yaml" in proc.stderr  # the merge is the job's second task, on a CPU node
    assert "exec " not in task["run"]  # the MOUNT_CACHED flush loop SkyPilot appends must be reached
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


@pytest.fixture(scope="module")
def wiki18_services() -> Any:
    """Two real services (create_app) whose `GET /` describes wiki-18 as the dense backend does: one Flat, one
    IVF16384,SQ8 (tests/rated_replica.py: only the index behind the batcher is stood in for)."""
    import contextlib

    from searchrl.retrieval.serving.app import create_app
    from searchrl.retrieval.settings import RetrievalSettings
    from tests.conftest import TINY_CORPUS
    from tests.live import serve_in_thread
    from tests.rated_replica import RatedSearch, Wiki18Replica

    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS))
    with contextlib.ExitStack() as stack:
        yield {
            kind: stack.enter_context(
                serve_in_thread(
                    create_app(
                        settings, Wiki18Replica(RatedSearch(TINY_CORPUS, 1e4), settings, index_type=kind)
                    )
                )
            )
            for kind in ("Flat", "IVF16384,SQ8")
        }


def _dry_run_train(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "sky",
        "train",
        "--dry-run",
        "--env",
        f"RETRIEVAL_SERVICE_URL={url}",
        "--env",
        "CHECKPOINT_BUCKET=b",
        *extra,
    ]
    return subprocess.run([sys.executable, "-m", "searchrl", *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "RETRIEVAL_API_KEY": TOKEN}, timeout=120)  # fmt: skip


@pytest.mark.live
def test_sky_train_refuses_a_flat_wiki18_index_and_launches_the_ivf_build(
    wiki18_services: dict[str, str],
) -> None:
    """Trap (issue 38 item 5): a wiki-18 service on Search-R1's Flat index passed the plan, and step 1's 2,560
    searches then outlasted the tool's timeout until the failure guard stopped the run. The plan reads `GET /` and
    refuses it in one line (exit 2, nothing launched); the documented IVF build passes."""
    flat = _dry_run_train(wiki18_services["Flat"])
    assert flat.returncode == 2, flat.stderr[-3000:]
    (line,) = [ln for ln in flat.stderr.splitlines() if ln.startswith("error: ")]
    assert "corpus wiki18 (21,015,324 passages) with a Flat index on CPU" in line, line
    assert "IVF16384,SQ8" in line and "ALLOW_FLAT_INDEX=1" in line and not flat.stdout
    ivf = _dry_run_train(wiki18_services["IVF16384,SQ8"])
    assert ivf.returncode == 0, ivf.stderr[-3000:]
    assert "retrieval corpus: backend dense, corpus wiki18 (21,015,324 passages)" in ivf.stderr


def test_the_flat_check_reads_get_slash_and_has_an_override() -> None:
    from searchrl.corpus_gate import check_service

    flat = {"service": "searchrl-retrieval", "backend": "dense", "corpus": "wiki18", "corpus_size": 21_015_324,
            "index_type": "Flat", "device": "cpu"}  # fmt: skip
    with pytest.raises(ConfigError, match="ALLOW_FLAT_INDEX=1"):
        check_service(flat, {})
    assert check_service(flat, {"ALLOW_FLAT_INDEX": "1"}).index_type == "Flat"
    assert check_service({**flat, "device": "cuda:0"}, {}).is_wiki18  # the index is searched on the GPU
    small = {
        **flat,
        "corpus": "wiki18-100k",
        "corpus_size": 100_000,
    }  # Flat is fine at 100k (and refused as small)
    with pytest.raises(ConfigError, match="not wiki-18"):
        check_service(small, {})
    assert check_service(small, {"ALLOW_SMALL_CORPUS": "1"}).corpus_size == 100_000
    hybrid = {"service": "searchrl-retrieval", "backend": "hybrid", "parts": [{**flat, "backend": "dense"}]}
    with pytest.raises(ConfigError, match="with a Flat index"):
        check_service(hybrid, {})


def test_module_imports_without_skypilot() -> None:
    code = "import sys; import searchrl.deploy.launch, searchrl.cli.sky, searchrl.cli.health; print('sky' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path("/"), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _make_n(*args: str) -> list[str]:
    """The commands `make -n ARGS` would run (printed, none executed)."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.live
@pytest.mark.parametrize(
    ("make_args", "nodes"),
    # (3 nodes: the plan refuses them, tests/test_sky_make.py)
    [(["NODES=4"], 4), (["ENV_EXTRA=NUM_NODES=8", "NETWORK_TIER=best"], 8)],
    ids=["NODES=4", "ENV=NUM_NODES=8,NETWORK_TIER=best"],
)
def test_make_train_dry_run_launches_the_asked_node_count(
    auth_url: str, make_args: list[str], nodes: int
) -> None:
    # the fixture serves a 20-passage corpus: the launch refuses it for Search-R1 data without ALLOW_SMALL_CORPUS
    env_items = [f"RETRIEVAL_SERVICE_URL={auth_url}", "CHECKPOINT_BUCKET=b", "ALLOW_SMALL_CORPUS=1"]
    args = [a for a in make_args if not a.startswith("ENV_EXTRA=")]
    env_items += [a.removeprefix("ENV_EXTRA=") for a in make_args if a.startswith("ENV_EXTRA=")]
    (line,) = [
        ln for ln in _make_n("train", "DRY_RUN=1", *args, f"ENV={' '.join(env_items)}") if "sky train" in ln
    ]
    argv = line.split()
    assert argv[:3] == [".venv-sky/bin/python", "-m", "searchrl"] and "--dry-run" in argv  # no dev venv
    proc = subprocess.run([sys.executable, "-m", "searchrl", *argv[3:]], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "RETRIEVAL_API_KEY": TOKEN}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    task = yaml.safe_load(proc.stdout)
    assert task["num_nodes"] == nodes
    assert _resource(task, "network_tier") == ("best" if "NETWORK_TIER=best" in make_args else "standard")
    assert _resource(task, "job_recovery")["max_restarts_on_errors"] >= 1


def test_sky_venv_stamp_follows_sky_spec(tmp_path: Path) -> None:
    venv = tmp_path / "sky-venv"
    venv.mkdir()
    (venv / ".sky").write_text("skypilot==0.14.1\n")
    (venv / ".sky").touch()
    same = _make_n("sky-venv", f"SKY_VENV={venv}", "SKY_SPEC=skypilot==0.14.1")
    assert not any("pip install" in ln for ln in same), same
    changed = _make_n("sky-venv", f"SKY_VENV={venv}", "SKY_SPEC=skypilot[aws]==0.14.1")
    assert any('pip install -q "skypilot[aws]==0.14.1" -e .' in ln for ln in changed), changed


def test_serve_retrieval_sky_needs_only_the_sky_venv() -> None:
    lines = _make_n("serve-retrieval-sky", "SKY_VENV=.venv-sky")
    assert not any(ln.startswith(".venv/") for ln in lines), lines  # no .venv it does not depend on
    assert lines[-1] == ".venv-sky/bin/python -m searchrl sky endpoint searchrl-retrieval"


def test_failed_replica_states_come_from_the_installed_skyserve() -> None:
    code = "from searchrl.deploy import endpoint, skypilot; print(','.join(sorted(endpoint.failed_replica_states())))"
    proc = subprocess.run([skypilot.sky_python(), "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    from_sky = set(proc.stdout.strip().split(","))
    assert from_sky == set(endpoint._REPLICA_FAILED_0_14_1)  # the fallback matches SkyServe 0.14.1
    assert {"FAILED_INITIAL_DELAY", "FAILED_PROVISION"} <= from_sky and "NOT_READY" not in from_sky


def test_start_budget_runs_without_skypilot_and_refuses_in_one_line() -> None:
    argv = ["sky", "start-budget", "--corpus", "wiki18", "--backend", "dense", "--delay", "2000"]
    env = {k: v for k, v in os.environ.items() if k != "SEARCHRL_SKY_PYTHON"}

    def budget(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "searchrl", *argv, *extra], cwd=REPO, capture_output=True,
                              text=True, env={**env, "PATH": "/usr/bin:/bin"}, timeout=60)  # fmt: skip

    proc = budget("--index-bucket", "")  # as setup passes an unset SEARCHRL_INDEX_BUCKET
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: corpus wiki18 with backend dense needs ~2898s to start downloading")
    assert "from an index bucket it needs ~1643s, which fits: build it once with sky/index-build.yaml" in line
    ok = budget("--index-bucket", "my-index")
    assert ok.returncode == 0 and ok.stderr.startswith(
        "replica start: corpus wiki18 with backend dense needs ~1643s from the index bucket (install + copy 78.67 GB"
    )
    image = budget("--index-bucket", "my-index", "--install", "image")
    assert image.returncode == 0 and "needs ~1343s from the index bucket (image (no install)" in image.stderr
    hybrid = subprocess.run([sys.executable, "-m", "searchrl", *argv[:5], "hybrid", "--delay", "2000",
                             "--index-bucket", "my-index"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert hybrid.returncode == 2 and "at least 2128 in sky/retrieval.yaml" in hybrid.stderr
