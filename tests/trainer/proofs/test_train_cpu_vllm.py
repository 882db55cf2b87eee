"""The CPU loop on verl's own vLLM server (`make train-cpu ROLLOUT=vllm`, trainer/proofs/train_cpu_vllm.py): its shims stay
out of every GPU run (what a GPU run imports is tests/trainer/test_rooms.py's), its overrides compose against verl's
config, its leftovers are removed; and, opt-in
(`make test-vllm`, `-m vllm_run`, in .venv-vllm-cpu), the run itself passes and `stale_sync` stops it at the
first sync."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from searchrl.errors import ConfigError
from searchrl.trainer.overrides import VLLM_SYNC_KEY, merge_overrides, render_overrides
from searchrl.trainer.proofs import train_cpu_vllm
from searchrl.trainer.proofs.train_cpu import cpu_overrides, cpu_settings
from searchrl.trainer.proofs.train_cpu_vllm import (
    PLUGINS,
    SHIMS,
    Leftovers,
    check_rollout,
    vllm_cpu_overrides,
)
from searchrl.trainer.settings import TrainSettings
from tests.conftest import REPO
from tests.trainer.test_checks_line import checks_figures

VLLM_VENV = REPO / ".venv-vllm-cpu"


def test_the_shims_are_named_only_by_the_cpu_run():
    """A grep over everything a deployment reads: trainer/, searchrl/, sky/, docker/; only the CPU run names them."""
    allowed = {"trainer/cpu/vllm_shims.py", "trainer/proofs/train_cpu_vllm.py"}
    for folder in ("trainer", "searchrl", "retrieval", "infer", "sky", "docker"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".yaml", ".yml", ".sh", ""}:
                rel = path.relative_to(REPO).as_posix()
                if rel not in allowed and "searchrl.trainer.cpu.vllm_shims" in path.read_text(
                    errors="replace"
                ):
                    assert rel in {"trainer/proofs/train_cpu.py"}, f"{rel} names the CPU vLLM shims"


def test_cpu_vllm_overrides_compose_and_keep_the_gpu_runs_plugins(tmp_path, compose):
    settings = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:9")
    gpu = render_overrides(settings)
    extra = merge_overrides(cpu_overrides(), vllm_cpu_overrides(settings, tmp_path / "ray"))
    cfg = compose(merge_overrides(gpu, extra))
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.mode == "async"
    assert (rollout.free_cache_engine, rollout.enable_sleep_mode, rollout.enforce_eager) == (
        False,
        False,
        True,
    )
    assert (
        rollout.dtype == "float32" and rollout.load_format == "dummy"
    )  # the GPU layout: weights by the sync
    assert rollout.top_p == settings.top_p and rollout.logprobs_mode == settings.rollout_logprobs_mode
    assert cfg.actor_rollout_ref.hybrid_engine is True and cfg.trainer.v1.trainer_mode == "sync"
    plugins = cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES.split(",")
    gpu_plugins = next(o.split("=", 1)[1] for o in gpu if o.startswith(VLLM_SYNC_KEY + "="))
    gpu_plugins = gpu_plugins.strip("'\"").split(",")  # hydra_value quotes it
    assert set(gpu_plugins) <= set(plugins) and plugins[-1] == SHIMS and tuple(plugins) == PLUGINS
    assert cfg.ray_kwargs.ray_init._temp_dir == str(tmp_path / "ray")
    # the KV cache sized to the tiny model's step through vLLM's own engine argument (its env var counts whole GiBs)
    assert rollout.engine_kwargs.vllm.kv_cache_memory_bytes == train_cpu_vllm.KV_CACHE_BYTES < 2**30


def test_the_engine_caches_outlive_the_run_and_its_config_does_not(tmp_path):
    """vLLM's model-info cache and inductor's kernels are kept beside the vLLM venv's packages (37 s -> 10 s of the
    tiny model's engine start, measured); its config folder is the run's scratch; no VLLM_CPU_KVCACHE_SPACE, which
    would override the engine argument above, unless asked for (the offline bench)."""
    env = train_cpu_vllm.vllm_cpu_env(tmp_path / "scratch")
    cache = train_cpu_vllm.engine_cache_dir()
    assert cache.parent == Path(sys.prefix) and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert (env["VLLM_CACHE_ROOT"], env["TORCHINDUCTOR_CACHE_DIR"]) == (
        str(cache / "vllm"),
        str(cache / "inductor"),
    )
    assert env["VLLM_CONFIG_ROOT"].startswith(str(tmp_path / "scratch"))
    cold = train_cpu_vllm.vllm_cpu_env(tmp_path / "s", cache=tmp_path / "s", kv_cache_gib=1)
    assert (
        cold["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "s"))
        and cold["VLLM_CPU_KVCACHE_SPACE"] == "1"
    )


def test_check_rollout_refuses_what_the_cpu_run_cannot_take():
    check_rollout("hf", "colocate_async")
    with pytest.raises(ConfigError, match="--rollout 'sglang'"):
        check_rollout("sglang", "sync")
    if Path(sys.prefix).resolve() != VLLM_VENV.resolve():
        with pytest.raises(ConfigError, match="make install-vllm-cpu"):
            check_rollout("vllm", "sync")  # .venv has no vLLM
    else:
        with pytest.raises(ConfigError, match="sync only"):
            check_rollout("vllm", "separate_async")


def test_leftovers_removes_what_the_run_left_and_nothing_else(tmp_path):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    leftovers = Leftovers.start(prefix="srl-test-")
    tag = uuid.uuid4().hex[:8]
    orphan, held, foreign = (
        Path(f"/dev/shm/psm_{tag}"),
        Path(f"/dev/shm/psm_h{tag}"),
        Path(f"/dev/shm/x_{tag}"),
    )
    socket = Path(f"/tmp/rl-colocate-zmq-test{tag}-replica-0-rank-0.sock")
    try:
        for path in (orphan, held, foreign, socket):
            path.write_bytes(b"\0" * 4096)
        (leftovers.scratch / "vllm-cache").mkdir()
        names = set(os.listdir("/dev/shm"))
        lock = multiprocessing.get_context("spawn").Lock()  # a live semaphore, mapped under a temporary name
        # sem.mp-*, or sem.loky-* once joblib's loky has patched multiprocessing's semaphore names in this process
        semaphores = {n for n in os.listdir("/dev/shm") if n.startswith(("sem.mp-", "sem.loky-"))} - names
        assert semaphores
        with held.open("r+b") as fh, mmap.mmap(fh.fileno(), 4096):  # a live process maps it: not ours to take
            found = leftovers.clean()
        # still there by name, so a spawned child can still open it (vLLM's EngineCore failed when it was not)
        assert all(Path("/dev/shm", n).exists() for n in semaphores) and lock.acquire(timeout=1)
        assert found["shm"] == [orphan.name] and found["zmq"] == [socket.name]
        assert not orphan.exists() and not socket.exists() and not leftovers.scratch.exists()
        assert held.exists() and foreign.exists()
    finally:
        for path in (orphan, held, foreign, socket):
            path.unlink(missing_ok=True)
        shutil.rmtree(leftovers.scratch, ignore_errors=True)


def test_make_train_cpu_takes_rollout_only_from_the_command_line():
    def dry(*args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(
            ["make", "--no-print-directory", "-n", "train-cpu", *args],
            cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
        ).stdout.splitlines()[-1]  # fmt: skip

    assert dry().startswith(".venv/bin/searchrl train cpu") and "--rollout" not in dry()
    assert dry(env={"ROLLOUT": "sglang"}) == dry()  # exported for the GPU targets: not the CPU run's engine
    assert dry("ROLLOUT=vllm").startswith(".venv-vllm-cpu/bin/searchrl train cpu")
    assert "--rollout vllm" in dry("ROLLOUT=vllm")


def test_the_cli_refuses_vllm_for_the_runs_it_does_not_cover(capsys):
    from searchrl.cli import main

    for run in ("gate", "real", "real-learn"):
        assert main(["train", "cpu", run, "--rollout", "vllm", "--model", "smollm2-135m"]) == 2
        assert "runs the tiny-model loops only (smoke, learn)" in capsys.readouterr().err
    # the learning run takes it, but only in an interpreter with vLLM's CPU build (this one, .venv, has none)
    assert main(["train", "cpu", "learn", "--rollout", "vllm", "--out", "/nonexistent/x"]) == 2
    assert "needs vLLM's CPU build in this interpreter" in capsys.readouterr().err


def test_make_learn_cpu_takes_rollout_vllm_into_the_vllm_venv():
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "learn-cpu", "ROLLOUT=vllm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[-1]
    assert dry.startswith(".venv-vllm-cpu/bin/searchrl train cpu learn") and "--rollout vllm" in dry
    plain = subprocess.run(
        ["make", "--no-print-directory", "-n", "learn-cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.splitlines()[-1].startswith(".venv/bin/searchrl train cpu learn")
    assert "--rollout" not in plain.stdout


# --- opt-in: the real run (make test-vllm) ---------------------------------------------------------------------


def _vllm_run(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    python = VLLM_VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} missing: run make install-vllm-cpu")
    cmd = [str(python), "-m", "searchrl", "train", "cpu", "--rollout", "vllm", "--out", str(tmp_path / "run")]
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=3000, env={**os.environ, **(env or {})}
    )


def _snapshot() -> tuple[set[str], set[str]]:
    return {p.name for p in Path("/dev/shm").iterdir()}, {p.name for p in Path("/tmp").glob("srl-vllm-*")}


def _no_leftovers(before: tuple[set[str], set[str]]) -> None:
    """No /dev/shm segment the run made outlives it unless a live process holds it; no scratch (Ray temp, vLLM
    caches) left in /tmp; vLLM wrote nothing under ~/.cache/vllm."""
    shm_before, scratch_before = before
    shm, scratch = _snapshot()
    held = train_cpu_vllm._mapped_shm()
    ours = {n for n in shm - shm_before if n.startswith(train_cpu_vllm.SHM_PREFIXES)}
    assert not {n for n in ours if train_cpu_vllm._inode(Path("/dev/shm", n)) not in held}, sorted(ours)
    assert not scratch - scratch_before, sorted(scratch - scratch_before)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two engine starts: 8-22 min on 2 shared cores (docs/cpu-proofs.md)
@pytest.mark.vllm_run  # verl's vLLM server on CPU, ~15 min on 2 cores
def test_train_cpu_on_verls_vllm_server_checks_every_sync_and_resumes(tmp_path):
    before = _snapshot()
    proc = _vllm_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if re.match(r"\| [123] \| ", ln)]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "3"]  # steps 1-2, then 3 after the resume
    assert "merged step 3" in proc.stdout and "search failures 0, LLM errors 0" in proc.stdout
    # the vLLM adapter's match line reached the run's logs once per sync (3 + 2), from the rank that checked it
    assert proc.stdout.strip().splitlines()[-1].startswith("checks: ")
    checks = checks_figures(proc.stdout)
    assert checks["syncs"] == 5 and checks["diff"] < 1e-4 and checks["covered"] == 3, checks
    assert checks["in_loss"] == 0 and checks["seen"] > 0 and checks["outside"] == 0, checks
    mode = TrainSettings(_env_file=None).rollout_logprobs_mode
    for i in (1, 2):
        text = (tmp_path / "run" / f"train-{i}.log").read_text(errors="replace")
        # verl started our server subclass with our worker extension, in the settings' log-prob mode
        assert "(FingerprintHttpServer pid=" in text
        assert re.search(
            r"'--worker_extension_cls',\n.*'searchrl\.trainer\.weight_sync\.vllm_classes\.SearchRLWorkerExtension'",
            text,
        )
        assert re.search(rf"'--logprobs_mode',\n.*'{mode}'", text)
        # the platform shim ran inside the vLLM worker (its output comes through the server actor)
        assert re.search(
            r"FingerprintHttpServer pid=\d+\).*vllm_shims in pid \d+: .*"
            r"(keep_plain_cpu_linear -> True|'vllm\.model_executor\.layers\.utils': True)",
            text,
        )
    _no_leftovers(before)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.vllm_run  # verl's vLLM server on CPU, ~5 min on 2 cores
def test_sabotage_stale_sync_stops_the_vllm_run_at_its_first_sync(tmp_path):
    before = _snapshot()
    proc = _vllm_run(tmp_path, {"SEARCHRL_TEST_SABOTAGE": "stale_sync"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "weight sync check failed at step 1" in proc.stderr, proc.stderr[-3000:]
    assert "error: SABOTAGE stale_sync was switched on" in proc.stderr  # never a healthy run's failure
    assert not (tmp_path / "run" / "train-2.log").exists()  # stopped in the first invocation
    _no_leftovers(before)
