"""The CPU async runs' replay buffer (trainer/cpu/ledger_sampler.py): every used weights version checked against the
hf rollout servers' ledgers, and the name verl loads it by."""

from __future__ import annotations

from typing import Any

import pytest
from verl.utils.import_utils import load_extern_type

from searchrl.errors import StepCheckError
from searchrl.trainer.cpu import ledger_sampler
from searchrl.trainer.cpu.ledger_sampler import HFLedgerReplayBufferAsync
from searchrl.trainer.plugins import versions
from searchrl.trainer.plugins.sampler import SearchReplayBufferAsync
from searchrl.trainer.proofs.harness import LEDGER_SAMPLER_NAME, LEDGER_SAMPLER_PATH
from tests.trainer.plugins.test_sampler_async import SPANNING_METRICS, SPANNING_TAGS, _batch, _buffer


def _ledgers(monkeypatch: pytest.MonkeyPatch, states: dict[int, str]) -> None:
    """One server whose ledger holds `states` (version -> "ok", or "stale": it holds other weights than it was sent)."""
    entries = {
        v: {"held": f"d{v}" if state == "ok" else "old", "sent": f"d{v}"} for v, state in states.items()
    }
    monkeypatch.setattr(ledger_sampler, "hf_ledgers", lambda: {"searchrl_hf_rollout_0": entries})


def test_verl_loads_the_subclass_the_cpu_overrides_name():
    loaded = load_extern_type(LEDGER_SAMPLER_PATH, LEDGER_SAMPLER_NAME)
    assert loaded is HFLedgerReplayBufferAsync and issubclass(loaded, SearchReplayBufferAsync)


def test_version_metrics_count_the_versions_the_ledgers_verified(monkeypatch):
    _ledgers(monkeypatch, {2: "ok", 3: "ok", 4: "ok"})
    buffer: Any = _buffer(HFLedgerReplayBufferAsync)
    assert buffer._version_metrics(_batch(*SPANNING_TAGS), global_steps=5) == {
        **SPANNING_METRICS,
        versions.VERIFIED: 2,  # versions 3 and 4, each in the ledger with the weights it was sent
        versions.BEFORE_LEDGER: 0,
    }


@pytest.mark.parametrize(
    ("states", "match"),
    [({3: "ok", 4: "stale"}, "not the d4 it was sent"), ({2: "ok", 3: "ok"}, "version 4 is not in")],
    ids=["unverified-sync", "never-loaded"],
)
def test_a_step_stops_on_a_version_no_server_verified(monkeypatch, states, match):
    _ledgers(monkeypatch, states)
    buffer: Any = _buffer(HFLedgerReplayBufferAsync, threshold=2)
    with pytest.raises(StepCheckError, match=match):
        buffer._version_metrics(_batch({"min_global_steps": 3, "max_global_steps": 4}), global_steps=5)
