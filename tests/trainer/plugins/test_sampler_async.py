"""The async replay buffer: verl's ReplayBufferAsync policy under our checks, and the per-step version checks.

TransferQueue's calls are replaced by a dict (as in test_train_cpu.py), so verl's own buffer code runs on it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import transfer_queue

from searchrl.errors import RolloutFailedError, StepCheckError
from searchrl.trainer.plugins import sampler, versions
from searchrl.trainer.plugins.sampler import SearchReplayBuffer, SearchReplayBufferAsync


def _buffer(cls: type, refill: Any = None, threshold: int | None = 2, **sampler_kwargs: Any) -> Any:
    return cls(
        trainer_mode="sync" if cls is SearchReplayBuffer else "colocate_async",
        trainer_config={},
        max_off_policy_threshold=threshold,
        max_off_policy_strategy="drop",
        sampler_kwargs=sampler_kwargs,
        refill_fn=refill,
    )


def _store(monkeypatch: pytest.MonkeyPatch, tags: dict[str, dict[str, Any]]) -> list[list[str]]:
    cleared: list[list[str]] = []

    def kv_clear(partition_id: str, keys: list[str]) -> None:
        cleared.append(sorted(keys))
        for key in keys:
            tags.pop(key, None)

    monkeypatch.setattr(transfer_queue, "kv_list", lambda: {"train": tags})
    monkeypatch.setattr(transfer_queue, "kv_clear", kv_clear)
    return cleared


def _groups() -> dict[str, dict[str, Any]]:
    return {
        "old": {"is_prompt": True, "status": "finished", "global_steps": 1},
        "old_0": {"status": "success", "min_global_steps": 0, "max_global_steps": 0},
        "new": {"is_prompt": True, "status": "finished", "global_steps": 5},
        "new_0": {"status": "success", "min_global_steps": 4, "max_global_steps": 4},
    }


def test_the_async_buffer_evicts_a_stale_group_and_refills_it_where_the_sync_one_keeps_it(monkeypatch):
    """Submitted at step 1, trained at step 5 with threshold 2: span 5 > 2. verl's ReplayBufferAsync drops it and
    asks for one prompt more; the sync buffer (what an async run got before) would train on it."""
    refills: list[int] = []
    cleared = _store(monkeypatch, _groups())
    keys, metrics = _buffer(SearchReplayBufferAsync, refills.append).wait_for_sampleable(5, "train", 1)
    assert keys == {"new"} and refills == [1] and cleared == [["old", "old_0"]]
    assert metrics["training/off_policy/evicted_samples"] == 1

    _store(monkeypatch, _groups())
    sync = _buffer(SearchReplayBuffer, refills.append)
    sync._sync_metadata_from_transfer_queue()
    assert sync._terminal_eviction_reasons(5, "train")[0] == set()  # no stale uids: nothing bounds staleness


def test_the_async_buffer_still_stops_at_a_failed_group(monkeypatch):
    tags = _groups()
    tags["bad"] = {"is_prompt": True, "status": "failure", "global_steps": 5}
    _store(monkeypatch, tags)
    with pytest.raises(RolloutFailedError, match=r"rollout groups failed \(1 in train\)"):
        _buffer(SearchReplayBufferAsync, lambda k: None).wait_for_sampleable(5, "train", 1)


def _batch(*tags: dict[str, Any]) -> Any:
    return SimpleNamespace(tags=list(tags))


# a step-5 batch: one trajectory spans the update to version 4, one is all version 4, and verl's padding filler
SPANNING_TAGS = (
    {"min_global_steps": 3, "max_global_steps": 4},
    {"min_global_steps": 4, "max_global_steps": 4},
    {"min_global_steps": None, "max_global_steps": None, "is_padding": True},  # verl's filler: left out
)
SPANNING_METRICS = {versions.MISSING: 0, versions.SPANNING: 1, versions.STALENESS_WORST_MAX: 1}


def test_version_metrics_count_spanning_trajectories_and_the_worst_staleness():
    """verl's servers keep no ledger: the production buffer checks stamps and staleness, and counts no verified
    version (the CPU runs' subclass does: tests/trainer/cpu/test_ledger_sampler.py)."""
    buffer = _buffer(SearchReplayBufferAsync)
    assert buffer._version_metrics(_batch(*SPANNING_TAGS), global_steps=5) == SPANNING_METRICS


@pytest.mark.parametrize(
    ("tags", "match"),
    [
        ({"min_global_steps": None, "max_global_steps": None}, "1 trajectories carry no weights version"),
        ({"min_global_steps": 2, "max_global_steps": 4}, "2 updates behind"),
    ],
    ids=["no-stamp", "too-stale"],
)
def test_a_step_stops_on_a_missing_stamp_or_excess_staleness(tags, match):
    buffer = _buffer(SearchReplayBufferAsync, threshold=2)
    with pytest.raises(StepCheckError, match=match):
        buffer._version_metrics(_batch(tags), global_steps=5)


def test_versions_older_than_the_servers_are_left_to_the_run_check_and_no_ledger_fails(monkeypatch):
    entries = {v: {"held": "x", "sent": "x"} for v in (2, 3)}
    counts, problems = versions.ledger_check({1, 2}, {"s0": entries})
    assert counts == {versions.VERIFIED: 1, versions.BEFORE_LEDGER: 1} and problems == []
    assert versions.ledger_check({1}, {})[1] == [
        "no rollout server ledger to check the weights versions against"
    ]


def test_the_sync_buffer_logs_no_version_metrics(monkeypatch):
    """Sync behaviour is unchanged: the version checks run only in the async modes."""
    monkeypatch.setattr(sampler.ReplayBuffer, "sample", lambda self, *a: (_batch(), {"x": 1}))
    monkeypatch.setattr(sampler, "search_extra_fields", lambda batch: [])
    monkeypatch.setattr(sampler, "response_masks", lambda batch: [])
    _, metrics = _buffer(SearchReplayBuffer).sample(1, "train", 1)
    assert not any(key.startswith("versions/") for key in metrics)
    monkeypatch.setattr(sampler.ReplayBufferAsync, "sample", lambda self, *a: (_batch(), {"x": 1}))
    _, metrics = _buffer(SearchReplayBufferAsync).sample(1, "train", 1)
    assert metrics[versions.MISSING] == 0 and versions.VERIFIED not in metrics


def test_sampler_kwargs_poll_interval_sets_how_often_the_buffer_polls():
    assert _buffer(SearchReplayBufferAsync).poll_interval == 2.0  # verl's default when the key is absent
    assert _buffer(SearchReplayBufferAsync, poll_interval_s=0.1).poll_interval == 0.1
