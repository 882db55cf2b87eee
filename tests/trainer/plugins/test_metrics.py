"""Search metrics reach what verl logs for a training step (console; W&B when WANDB_API_KEY is set).

The chain under test, with verl's own code wherever it runs on CPU: verl's ToolAgentLoop runs OUR tool against a
live BM25 service (and a dead one) -> the tool's counters in each AgentLoopOutput's extra_fields -> the sample
fields verl's AgentLoopWorkerTQ stores (`AgentLoopOutput.as_dict()` + `list_of_dict_to_tensordict`) -> our
replay buffer's `sample` (whose metrics verl adds to the step's, trainer_base.py:567-572) -> verl's `Tracking`
with its `file` and `console` backends. Here TransferQueue's server is stood in (`tq.kv_batch_get` returns the
tensordict verl's worker would have stored, verl's own `ReplayBuffer.sample` returns the batch); the CPU run
(tests/trainer/e2e/test_train_cpu.py) shows the same metrics in a real run's console log.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from searchrl.trainer.overrides import SAMPLER_NAME, SAMPLER_PATH, TRAINER_MODE, render_overrides
from searchrl.trainer.plugins.metrics import BASE_FAILURE_KINDS, search_step_metrics
from searchrl.trainer.settings import TrainSettings


def test_step_metrics_from_trajectory_counters():
    rows = [
        {
            "search_calls": 2,
            "search_failures": 1,
            "search_failure_kinds": "timeout",
            "search_queries": 3,
            "search_results": 6,
            "search_empty_calls": 0,
            "search_latencies_ms": "10.0,30.0",
        },
        {
            "search_calls": 2,
            "search_failures": 2,
            "search_failure_kinds": "http_502,bad_arguments",
            "search_queries": 1,
            "search_results": 0,
            "search_latencies_ms": "50.0,70.0",
        },
        {},  # a trajectory that never searched
        None,  # verl fills a missing extra field with None
    ]
    m = search_step_metrics(rows)
    assert m["search/calls"] == 4 and m["search/queries"] == 4
    assert m["search/calls_per_trajectory"] == 1.0 and m["search/trajectories_searched"] == 0.5
    assert m["search/failures"] == 3 and m["search/failure_rate"] == 0.75
    assert m["search/failures/timeout"] == 1 and m["search/failures/bad_arguments"] == 1
    assert m["search/failures/http_502"] == 1  # a kind outside the base set still shows
    assert m["search/failures/connect"] == 0  # base kinds are always there, for a line from step 1
    assert m["search/results_per_query"] == 1.5
    assert m["search/latency_ms_p50"] == 40.0 and m["search/latency_ms_max"] == 70.0
    assert m["search/latency_ms_p95"] == pytest.approx(67.0)


def test_a_step_without_search_has_counts_but_no_latency():
    m = search_step_metrics([{}, {}])
    assert m["search/calls"] == 0 and m["search/failure_rate"] == 0
    assert {f"search/failures/{k}" for k in BASE_FAILURE_KINDS} <= set(m)
    assert not any(k.startswith("search/latency") for k in m)


def test_overrides_keep_verls_sync_mode_and_select_our_sampler(compose, tmp_path):
    """verl compares the mode with the literal "sync" (trainer_base.py:153, 731, 902, 1004, 1499): any other name
    switches on the async replay buffer, a one-row dataloader and trajectory checkpoints (issue 20)."""
    cfg = compose(render_overrides(TrainSettings(data_dir=tmp_path)))
    assert cfg.trainer.use_v1 is True  # verl 0.9.1's default: the V1 trainer, picked by name
    assert TRAINER_MODE == "sync" and cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.trainer.v1.sampler.custom_sampler.path == SAMPLER_PATH
    assert cfg.trainer.v1.sampler.custom_sampler.name == SAMPLER_NAME
    from verl.utils.import_utils import load_extern_type

    from searchrl.trainer.plugins.sampler import SearchReplayBuffer

    assert load_extern_type(SAMPLER_PATH, SAMPLER_NAME) is SearchReplayBuffer  # how verl loads it


def test_wandb_only_with_its_key_and_the_key_never_in_argv(compose, tmp_path, monkeypatch):
    cfg = compose(render_overrides(TrainSettings(data_dir=tmp_path)))
    assert list(cfg.trainer.logger) == ["console"]
    monkeypatch.setenv("WANDB_API_KEY", "sk-wandb-secret-123")
    argv = render_overrides(TrainSettings(data_dir=tmp_path))
    assert list(compose(argv).trainer.logger) == ["console", "wandb"]
    assert not any("sk-wandb-secret-123" in a for a in argv)


@pytest.mark.live
@pytest.mark.slow
def test_search_metrics_arrive_in_verls_step_log(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample, monkeypatch
):
    import transfer_queue
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.utils.tracking import Tracking

    from searchrl.trainer.data import prepare_data
    from searchrl.trainer.plugins.sampler import SearchReplayBuffer
    from searchrl.trainer.toolconfig import write_tool_config
    from tests.conftest import free_port
    from tests.trainer.plugins.test_agent_loop import (
        RIGHT,
        SEVENTH_SEAL_QUESTION,
        THINK_ANSWER,
        _dataset_row,
        _run_loop,
        _settings,
        tool_call_text,
    )

    # Two rollouts of the same prompt through verl's ToolAgentLoop: one against the live service, one against
    # a port nobody listens on (no retries), as two samples of one GRPO group would see a flaky replica.
    outputs = []
    for url in (live_bm25_url, f"http://127.0.0.1:{free_port()}"):
        settings = _settings(tmp_path / str(len(outputs)), qa_sample, url).model_copy(
            update={"retrieval_max_retries": 0}
        )
        prepare_data(settings)
        write_tool_config(settings)
        cfg = compose(render_overrides(settings))
        row = _dataset_row(settings, cfg, offline_tokenizer, tmp_path)
        replies = [tool_call_text(SEVENTH_SEAL_QUESTION), f"{THINK_ANSWER}\n{RIGHT}"]
        output, _ = asyncio.run(_run_loop(cfg, offline_tokenizer, row, replies, []))
        outputs.append(output)

    # The sample fields AgentLoopWorkerTQ puts into TransferQueue, plus one padding row verl adds to fill a batch.
    stored = list_of_dict_to_tensordict([o.as_dict() for o in outputs + outputs[:1]])
    batch = SimpleNamespace(
        keys=["a_0_0", "a_1_0", "pad"],
        partition_id="train",
        tags=[{}, {}, {"is_padding": True}],
    )
    asked: list[dict] = []

    def kv_batch_get(keys, partition_id, select_fields):
        asked.append({"keys": keys, "partition_id": partition_id, "select_fields": select_fields})
        return stored.select(*select_fields)

    def verl_sample(self, global_steps, partition_id, batch_size):
        return batch, {"training/eviction_marker": global_steps}

    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(ReplayBuffer, "sample", verl_sample)
    buffer = object.__new__(SearchReplayBuffer)  # its __init__ is verl's; sample() is what is under test
    got, metrics = buffer.sample(global_steps=7, partition_id="train", batch_size=2)

    assert got is batch
    assert asked == [
        {"keys": batch.keys, "partition_id": "train", "select_fields": fields}
        for fields in (["extra_fields"], ["responses", "response_mask"])
    ]
    # the mask invariant, from what verl stored: both trajectories recorded, mask 1 exactly on the generated turns
    assert metrics["loss/mask_outside_generated"] == metrics["loss/mask_missing_in_generated"] == 0
    assert metrics["loss/unrecorded_trajectories"] == 0
    assert metrics["training/eviction_marker"] == 7  # verl's own metrics are still there
    assert metrics["search/trajectories"] == 2
    assert metrics["search/calls"] == 2  # the padding row is not counted
    assert metrics["search/failures"] == 1 and metrics["search/failures/connect"] == 1
    assert metrics["search/failure_rate"] == 0.5 and metrics["search/trajectories_searched"] == 1.0
    assert metrics["search/results_per_query"] == 1.5  # top-3 for the live call, nothing for the dead one
    assert 0 < metrics["search/latency_ms_p50"] <= metrics["search/latency_ms_p95"] < 30_000
    _, val_metrics = buffer.sample(global_steps=7, partition_id="val", batch_size=2)
    assert not any(k.startswith("search/") for k in val_metrics)  # validation steps log their own way

    # verl's Tracking, as the trainer's fit loop calls it, with the file backend (the console one prints).
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "tracking"))
    tracking = Tracking(
        project_name="searchrl", experiment_name="metrics", default_backend=["console", "file"]
    )
    tracking.log(data=metrics, step=7)
    tracking.logger["file"].finish()
    lines = (tmp_path / "tracking" / "searchrl" / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    assert logged[-1]["step"] == 7
    assert logged[-1]["data"]["search/calls"] == 2 and logged[-1]["data"]["search/failures/connect"] == 1
