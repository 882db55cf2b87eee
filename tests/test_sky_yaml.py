"""The sky/ task files through SkyPilot's real parser, and sky/retrieval.yaml's readiness probe against a real
service started the way its `run:` starts it.

SkyPilot lives in `.venv-sky` (its click pin clashes with verl's deps), so the SkyPilot half runs in a
subprocess of `deploy.sky_python()`; `searchrl sky ...` from this interpreter re-runs itself there, as users see.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from searchrl import deploy
from tests.conftest import REPO, TINY_CORPUS
from tests.live import free_port

SKY = REPO / "sky"
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


def in_sky_python(code: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [deploy.sky_python(), "-c", code],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


# --- static checks of the files (no SkyPilot needed) ------------------------------------------------------------


def test_the_four_task_files_exist_and_sky_is_not_a_python_package() -> None:
    assert [p.name for p in deploy.task_files()] == list(deploy.TASK_FILES)
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
    assert (
        run.index("searchrl health") < run.index("searchrl train local") < run.index("searchrl train merge")
    )
    assert "ray.init" not in run and "address=auto" not in run
    for pin in ('"verl[sglang]==0.9.1"', '"sglang==0.5.12"', '"uvloop==0.21.0"'):
        assert pin in setup
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
    assert len(oks) == 4, proc.stdout
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
            "import json, os; from pathlib import Path; from searchrl import deploy\n"
            f"envs = {overrides!r}\n"
            "t = deploy.load_task(Path('sky/retrieval.yaml'), envs, {'RETRIEVAL_API_KEY': os.environ['TOKEN']})\n"
            "p = deploy.readiness_probe(t)\n"
            "print(json.dumps({'run': t.run, 'envs': t.envs, 'method': p.method, 'path': p.path,\n"
            "                  'post_data': p.post_data, 'headers': p.headers, 'timeout': p.timeout_s}))",
            env={"TOKEN": TOKEN},
        )
    )
    env = {**os.environ, **parsed["envs"], "RETRIEVAL_API_KEY": TOKEN}  # SkyPilot exports envs and secrets
    log_path = tmp_path / "service.log"
    log_file = log_path.open("w")
    proc = subprocess.Popen(
        ["bash", "-c", parsed["run"]], cwd=REPO, env=env, stdout=log_file, stderr=log_file
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"service exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "service did not come up in 90 s"
            time.sleep(0.1)
        yield base, parsed
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log_file.close()


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
