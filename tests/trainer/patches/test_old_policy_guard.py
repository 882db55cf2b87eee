"""verl's saved old policy aliases the live weights on CPU, and trainer/patches/old_policy_guard.py makes it a copy.

A world-1 gloo group and a `fully_shard`ed Linear: verl's own `fsdp2_sharded_save_to_cpu` and its
`DetachActorWorker.save_model_to_cpu` / `restore_model_from_cpu` (what `separate_async` calls around each local
update when `parameter_sync_step > 1`), with a real optimizer step between save and restore.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist


@pytest.fixture()
def sharded(tmp_path: Any) -> Iterator[torch.nn.Module]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        yield model
    finally:
        dist.destroy_process_group()


def _step(model: torch.nn.Module) -> None:
    """One real optimizer step: updates the parameters in place, as the actor's update does."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.ones(5, 4)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _local(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p._local_tensor.detach().clone() for name, p in model.named_parameters()}  # type: ignore[union-attr]


def _raw_save() -> Any:
    from verl.utils import fsdp_utils

    save = fsdp_utils.fsdp2_sharded_save_to_cpu
    return getattr(save, "__wrapped__", save)  # verl's own function, whether or not the guard is installed


def test_verls_fsdp2_save_on_cpu_is_the_live_tensor_and_its_restore_is_a_no_op(sharded) -> None:
    from verl.utils.fsdp_utils import fsdp2_sharded_load_from_cpu

    state, spec = _raw_save()(sharded)
    live = dict(sharded.named_parameters())
    assert all(state[name][0].data_ptr() == live[name]._local_tensor.data_ptr() for name in live)
    old = _local(sharded)
    _step(sharded)
    fsdp2_sharded_load_from_cpu(sharded, state, spec)
    assert all(
        not torch.equal(_local(sharded)[name], old[name]) for name in old
    )  # "restored" = the new weights


def test_verls_worker_restores_the_old_policy_with_the_guard(sharded) -> None:
    """verl's DetachActorWorker save/restore sequence of one decoupled-PPO local step, through verl's own lookup."""
    from verl.experimental.separation.engine_workers import DetachActorWorker

    from searchrl.trainer.patches import old_policy_guard

    old_policy_guard.install()
    worker = DetachActorWorker.__new__(DetachActorWorker)  # its __init__ builds a whole FSDP actor
    worker._strategy_handlers = None
    worker.config = SimpleNamespace(actor=SimpleNamespace(strategy="fsdp2"))
    worker.actor = SimpleNamespace(engine=SimpleNamespace(module=sharded))

    worker.save_model_to_cpu(0)  # local trigger 0: pi_old
    old = _local(sharded)
    _step(sharded)
    new = _local(sharded)
    assert all(not torch.equal(new[name], old[name]) for name in old)
    worker.save_model_to_cpu(1)  # trigger 1: save current, restore pi_old, compute, restore current
    worker.restore_model_from_cpu(0)
    assert all(torch.equal(_local(sharded)[name], old[name]) for name in old)
    worker.restore_model_from_cpu(1)
    assert all(torch.equal(_local(sharded)[name], new[name]) for name in new)
    worker.clear_cpu_model(1)


def test_every_process_of_a_cpu_run_installs_the_guard_the_logger_fix_and_the_step_line_end() -> None:
    """verl imports VERL_USE_EXTERNAL_MODULES at `import verl`, in the driver and every Ray worker."""
    from searchrl.trainer.cpu.plugin import ENV

    script = (
        "import verl\n"
        "from verl.utils import fsdp_utils\n"
        "print(getattr(fsdp_utils.fsdp2_sharded_save_to_cpu, '_searchrl_clones_aliases', False))\n"
        "import logging\n"
        "print(getattr(logging.getLogger('verl.trainer.ppo.v1.trainer_separate_async'), '_searchrl_drops_flush', False))\n"
        "from verl.utils.logger import aggregate_logger\n"
        "print(getattr(aggregate_logger.concat_dict_to_str, '_searchrl_line_end', False))\n"
    )
    env = {**os.environ, **ENV}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the old-policy guard, the separate_async logger fix, the step line's end (trainer/patches/step_line.py)
    assert out.stdout.split()[-3:] == ["True", "True", "True"]
