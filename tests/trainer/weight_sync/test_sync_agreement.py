"""A weight-sync mismatch on one trainer rank stops every rank within seconds (issue 46 item 4).

Two real processes on gloo, as verl's trainer ranks: rank 0 holds the rollout server and finds the mismatch (its
vLLM workers kept the initial weights: the adapter and engine stand-ins of tests/trainer/weight_sync/test_vllm_sync.py, whose
check is the GPU run's own FingerprintAdapterMixin on the shared tap, trainer/weight_sync/tap.py), rank 1 has no
server and only sends. After the sync each rank walks on to verl's next collective (a barrier here). Before the fix
rank 0 raised alone and rank 1 waited in that barrier for the process group's timeout (verl passes None: 10
minutes on NCCL); now both raise StepCheckError at the sync, rank 1 within seconds.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync import fingerprint as weight_fingerprint
from tests.conftest import apply_clean_environ, free_port

# the group's own timeout: what a rank left behind would wait for (bounded here so the "before" case ends)
GROUP_TIMEOUT_S = 12


def _rank(rank: int, port: int, out: Any) -> None:
    """Both cases on one process group (one start-up): with the agreement, then without it (last, because it
    leaves rank 1 in a barrier until the group's timeout)."""
    from tests.trainer.weight_sync.qwen2_stream import hf_weights
    from tests.trainer.weight_sync.test_vllm_sync import Adapter, Engine, Server, VerlDroppingServer, Worker

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
    )
    for agree in (True, False):
        if not agree:  # the behaviour before the fix: each rank decides alone
            import searchrl.trainer.weight_sync.tap as tap

            tap.agree_across_ranks = _alone  # type: ignore[assignment]
        workers = [Worker(0, 1)]
        if rank == 0:  # loads the initial sync, then ignores the update (TRL #5312)
            adapter = Adapter(workers, Server(Engine(workers)), stale_after=1)
        else:
            adapter = Adapter(workers, VerlDroppingServer(Engine(workers)), has_server=False)
        t0 = time.monotonic()
        outcome = "passed"
        try:
            for step in range(2):  # the initial sync, then the update after step 1
                asyncio.run(adapter.update_weights(iter(hf_weights(step).items()), global_steps=step))
                dist.barrier()  # verl's next collective
        except StepCheckError as exc:
            outcome = f"StepCheckError: {exc}"
        except RuntimeError as exc:
            outcome = f"RuntimeError: {str(exc).splitlines()[0]}"
        out.put((agree, rank, outcome, time.monotonic() - t0))
    out.close()
    out.join_thread()  # the queue's feeder thread delivers before the hard exit below
    # a Ray worker stays alive after its task raised: its peer sees no closed connection, only silence
    time.sleep(GROUP_TIMEOUT_S + 5)
    os._exit(0)  # a rank whose peer is gone must not wait in the process group's teardown


def _alone(problem: StepCheckError | None, global_steps: int | None) -> None:
    if problem is not None:
        raise problem


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[bool, int], tuple[str, float]]:
    """{(with the agreement, rank): (how the two syncs ended, seconds)} from one pair of gloo processes."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    with pytest.MonkeyPatch.context() as patch:
        # spawned ranks take this environment, and a module fixture starts before clean_env
        apply_clean_environ(patch)
        for p in procs:
            p.start()
    results = {}
    try:
        for _ in range(4):
            agree, rank, outcome, seconds = out.get(timeout=GROUP_TIMEOUT_S + 240)
            results[(agree, rank)] = (outcome, seconds)
    finally:
        for p in procs:  # every outcome is in: the ranks only wait now (rank 0 as a live Ray worker would)
            p.kill()
            p.join(timeout=30)
    return results


@pytest.mark.timeout(400)
def test_a_mismatch_on_one_rank_stops_every_rank_within_seconds(outcomes: dict[Any, Any]) -> None:
    (zero, _), (one, seconds) = outcomes[(True, 0)], outcomes[(True, 1)]
    assert zero.startswith("StepCheckError: weight sync check failed at step 2 (the update after step 1)"), (
        zero
    )
    assert one.startswith("StepCheckError: weight sync check failed at step 2 on another trainer rank"), one
    assert seconds < GROUP_TIMEOUT_S / 2, outcomes  # the agreement, not the group's timeout


@pytest.mark.timeout(400)
def test_before_the_agreement_the_rank_without_the_server_waited_for_the_group_timeout(
    outcomes: dict[Any, Any],
) -> None:
    """The failure the fix removes, measured with the same ranks: rank 1 learns nothing until the timeout."""
    assert outcomes[(False, 0)][0].startswith("StepCheckError: weight sync check failed at step 2")
    outcome, seconds = outcomes[(False, 1)]
    assert outcome.startswith("RuntimeError") and seconds >= GROUP_TIMEOUT_S - 1, outcomes


def test_a_rank_that_never_reaches_the_agreement_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process group of 2 where the peer never comes: the agreement gives up after AGREE_TIMEOUT_S."""
    monkeypatch.setattr(weight_fingerprint, "AGREE_TIMEOUT_S", 2.0)
    store = dist.HashStore()
    # a second rank is announced but never joins: gloo's connect would wait; instead time the wait on a 2-rank
    # group whose peer exists but never all-reduces
    ctx = mp.get_context("spawn")
    port = free_port()
    peer = ctx.Process(target=_idle_peer, args=(port,))
    peer.start()
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
        )  # fmt: skip
        t0 = time.monotonic()
        with pytest.raises(StepCheckError, match=r"not every trainer rank reported its check within 2 s"):
            weight_fingerprint.agree_across_ranks(None, 3)
        assert time.monotonic() - t0 < 10
    finally:
        del store
        peer.kill()
        peer.join(timeout=10)
        dist.destroy_process_group()


def _idle_peer(port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
    )  # fmt: skip
    time.sleep(60)
