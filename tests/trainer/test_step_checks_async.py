"""The async CPU run's checks (trainer/step_checks.py per step, trainer/proofs/train_cpu.py over the run) and its
verl keys (trainer/proofs/train_cpu.py), without a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.errors import ConfigError
from searchrl.trainer.cpu.hf_log import UPDATE_LINE, update_digests
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.plugins import versions
from searchrl.trainer.plugins.generated_spans import MISSING, OUTSIDE, UNRECORDED
from searchrl.trainer.proofs.train_cpu import (
    ASYNC_THRESHOLD,
    async_cpu_overrides,
    async_run_problems,
    check_mode,
    cpu_settings,
)
from searchrl.trainer.step_checks import (
    STALENESS_WORST_MAX,
    UPDATE_WEIGHTS_S,
    StepRow,
    async_step_problems,
)

CLEAN = {
    "loss/observation_tokens_in_loss": 0,
    "search/calls": 2,
    "loss/observation_tokens": 10,
    OUTSIDE: 0,
    MISSING: 0,
    UNRECORDED: 0,
}


def _row(step: int, run: str, worst: float, diff: float, spanning: int = 0, **extra: float) -> StepRow:
    metrics = {
        **CLEAN,
        "training/rollout_probs_diff_max": diff,
        STALENESS_WORST_MAX: worst,
        versions.MISSING: 0,
        versions.STALENESS_WORST_MAX: worst,
        versions.VERIFIED: 1,
        versions.SPANNING: spanning,
        **extra,
    }
    return StepRow(step, run, metrics)


def test_the_prob_diff_bound_holds_only_on_steps_without_stale_trajectories():
    assert async_step_problems(_row(2, "1", worst=1, diff=0.3), threshold=2) == []
    assert "sync max prob diff 0.3" in async_step_problems(_row(2, "1", worst=0, diff=0.3), threshold=2)[0]


def test_a_step_without_stamps_or_beyond_the_bound_or_without_verl_staleness_fails():
    no_stamp = _row(2, "1", worst=0, diff=0.0, **{versions.MISSING: 2})
    assert async_step_problems(no_stamp, threshold=2) == ["step 2: 2 trajectories carry no weights version"]
    assert "worst staleness 2 above 1" in async_step_problems(_row(3, "1", worst=2, diff=0.0), threshold=2)[0]
    row = _row(2, "1", worst=0, diff=0.0)
    del row.metrics[STALENESS_WORST_MAX], row.metrics[versions.VERIFIED]
    problems = async_step_problems(row, threshold=2)
    assert any(STALENESS_WORST_MAX in p for p in problems) and any(versions.VERIFIED in p for p in problems)


def _log(*updates: tuple[int, int, str]) -> str:
    return "\n".join(
        "(HFGenerateServer pid=1) "
        + UPDATE_LINE.format(n=n, step=step, tensors=27, fingerprint=digest, note="")
        for n, step, digest in updates
    )


def test_update_lines_parse_with_their_digests():
    assert update_digests(_log((1, 0, "ab12"), (2, 1, "cd34"))) == [(1, 0, "ab12"), (2, 1, "cd34")]


def test_the_run_checks_spanning_versions_in_update_lines_and_the_resumed_weights():
    first = _log((1, 0, "a0"), (2, 1, "a1"), (3, 2, "a2"))
    restored = "(TaskRunnerV1 pid=2) INFO:2026-11-27 13:33:52,970:Restored 2 training prompt groups from TransferQueue"
    second = _log((1, 2, "a2"), (2, 3, "a3")) + "\n" + restored
    rows = [_row(1, "1", 0, 0.0), _row(2, "1", 1, 0.1, spanning=1), _row(3, "2 (resumed)", 1, 0.1)]
    assert async_run_problems(rows, [first, second], resume_step=2) == []

    assert async_run_problems([_row(1, "1", 0, 0.0)], [first, second], 2) == [
        "no trained trajectory spans two weights versions (no turn was cut by an update and resumed)"
    ]
    unloaded = async_run_problems(rows, [_log((1, 1, "a1"), (2, 2, "a2")), second], 2)
    assert unloaded == [
        f"step {step}: weights version 0 is in no update line (no sync loaded it)" for step in (1, 2)
    ]
    restarted = async_run_problems(rows, [first, _log((1, 2, "ffff"), (2, 3, "a3")) + "\n" + restored], 2)
    assert len(restarted) == 1 and "the checkpoint did not restore the policy" in restarted[0]
    fresh = async_run_problems(rows, [first, _log((1, 2, "a2"), (2, 3, "a3"))], 2)
    assert len(fresh) == 1 and "restored no prompt group" in fresh[0]


def test_the_async_mode_renders_verls_keys_and_a_bad_mode_is_one_clear_error(tmp_path: Path) -> None:
    settings = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:1", mode="colocate_async")
    keys = dict(o.split("=", 1) for o in [*render_overrides(settings), *async_cpu_overrides(settings)])
    assert keys["trainer.v1.trainer_mode"] == "colocate_async"
    assert keys["trainer.v1.sampler.custom_sampler.path"] == "pkg://searchrl.trainer.cpu.ledger_sampler"
    assert keys["trainer.v1.sampler.custom_sampler.name"] == "HFLedgerReplayBufferAsync"
    assert keys["trainer.v1.sampler.max_off_policy_threshold"] == str(ASYNC_THRESHOLD)
    assert float(keys["trainer.v1.colocate_async.num_warmup_batches"]) == 1
    sync = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:1")
    assert async_cpu_overrides(sync) == []
    with pytest.raises(
        ConfigError, match="--trainer-mode 'async': the CPU run takes sync, colocate_async, separate_as"
    ):
        check_mode("async")


def test_a_separate_async_step_without_a_timed_weight_push_fails():
    """separate_async pushes the weights to the standalone replica every step (verl's timing_s/update_weights);
    a step without it was trained on weights the rollout never got. Other modes do not require the metric."""
    timed = _row(2, "1", worst=1, diff=0.1, **{UPDATE_WEIGHTS_S: 0.07})
    assert async_step_problems(timed, threshold=2, weight_push=True) == []
    untimed = _row(2, "1", worst=1, diff=0.1)
    assert async_step_problems(untimed, threshold=2, weight_push=True) == [
        f"step 2: verl logged no {UPDATE_WEIGHTS_S}, so the weight push to the rollout replicas is unchecked"
    ]
    assert async_step_problems(untimed, threshold=2) == []


def test_spanning_is_required_only_where_the_mode_makes_it_reliable():
    first = _log((1, 0, "a0"), (2, 1, "a1"), (3, 2, "a2"))
    restored = "(TaskRunnerV1 pid=2) INFO:Restored 2 training prompt groups from TransferQueue"
    second = _log((1, 2, "a2"), (2, 3, "a3")) + "\n" + restored
    rows = [_row(1, "1", 0, 0.0), _row(2, "1", 1, 0.1), _row(3, "2 (resumed)", 1, 0.1)]
    assert len(async_run_problems(rows, [first, second], 2)) == 1
    assert async_run_problems(rows, [first, second], 2, require_spanning=False) == []


def test_the_separate_async_cpu_run_is_a_trainer_and_a_rollout_pool_of_one_fake_gpu_each(
    tmp_path: Path,
) -> None:
    """Two fake Ray GPUs (trainer 1 x 1, standalone rollout 1 x 1), the gloo engine, two local updates per push
    (parameter_sync_step 2: the old-policy path trainer/patches/old_policy_guard.py guards), our async buffer with the
    hf ledger check, and every key once (hydra refuses a key given twice)."""
    from searchrl.trainer.cpu import gloo_engine
    from searchrl.trainer.overrides import merge_overrides
    from searchrl.trainer.proofs.train_cpu import (
        GLOO_BUCKET_MB,
        GLOO_ENGINE,
        GLOO_ENGINE_MODULE,
        cpu_overrides,
    )

    # the names the run gives verl are the engine's own: its registered backend and its module
    assert (GLOO_ENGINE, GLOO_ENGINE_MODULE) == (gloo_engine.BACKEND, gloo_engine.__name__)

    settings = cpu_settings(tmp_path, tmp_path / "model", "http://127.0.0.1:1", mode="separate_async")
    extra = merge_overrides(cpu_overrides(), async_cpu_overrides(settings))
    rendered = merge_overrides(render_overrides(settings), extra)
    names = [o.split("=", 1)[0].lstrip("+") for o in rendered]
    assert len(names) == len(set(names))
    keys = {k.lstrip("+"): v for k, v in (o.split("=", 1) for o in rendered)}
    assert keys["trainer.v1.trainer_mode"] == "separate_async"
    assert keys["trainer.v1.separate_async.parameter_sync_step"] == "2"
    assert keys["actor_rollout_ref.hybrid_engine"] == "False"
    assert (keys["trainer.nnodes"], keys["trainer.n_gpus_per_node"]) == ("1", "1")
    assert (keys["actor_rollout_ref.rollout.nnodes"], keys["actor_rollout_ref.rollout.n_gpus_per_node"]) == (
        "1",
        "1",
    )
    assert keys["ray_kwargs.ray_init.num_gpus"] == "2"
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.backend"] == GLOO_ENGINE
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"] == GLOO_ENGINE_MODULE
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"] == str(
        GLOO_BUCKET_MB
    )
    assert keys["actor_rollout_ref.rollout.engine_kwargs.hf.threads"] == "1"
    assert keys["trainer.v1.sampler.custom_sampler.name"] == "HFLedgerReplayBufferAsync"
    check_mode("separate_async")
