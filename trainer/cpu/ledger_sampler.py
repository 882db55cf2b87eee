"""The CPU async runs' replay buffer: ours (trainer/plugins/sampler.py), plus every weights version a step's
trajectories used checked against the hf rollout servers' ledgers.

The hf engine (trainer/cpu/hf_rollout.py) adds a ledger entry per weight update: the digest of the weights the
server then holds beside that of what it was sent. verl's vLLM and sglang servers keep none, so the production
buffer checks nothing there (`ledger_check`); the CPU runs' async overrides (trainer/proofs/harness.py
`async_cpu_overrides`) point verl's `trainer.v1.sampler.custom_sampler` at this subclass instead, and a step that
used a version no server verified stops the run (StepCheckError, trainer/plugins/versions.py `ledger_check`).
"""

from __future__ import annotations

from typing import cast

import ray

from searchrl.trainer.cpu.hf_rollout import HF_SERVER_NAME
from searchrl.trainer.plugins import versions
from searchrl.trainer.plugins.sampler import SearchReplayBufferAsync


class HFLedgerReplayBufferAsync(SearchReplayBufferAsync):
    """SearchReplayBufferAsync whose version checks read every hf rollout server's ledger."""

    def ledger_check(self, used: set[int]) -> tuple[dict[str, int], list[str]]:
        return versions.ledger_check(used, hf_ledgers())


def hf_ledgers() -> dict[str, versions.Ledger]:
    """Every hf rollout server's version ledger, by actor name (servers 0, 1, ... until one is not found)."""
    ledgers: dict[str, versions.Ledger] = {}
    while True:
        name = HF_SERVER_NAME.format(rank=len(ledgers))
        try:
            actor = ray.get_actor(name)
        except ValueError:
            return ledgers
        ledgers[name] = cast(versions.Ledger, ray.get(actor.ledger.remote()))


__all__ = ["HFLedgerReplayBufferAsync", "hf_ledgers"]
