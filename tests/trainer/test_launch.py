"""make train-local's logic: GPU and driver checks, resume rules, data, tool config, live health and corpus checks,
run record, verl command. The GPU count and nvidia-smi are faked, so the tests pass on any machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from searchrl.errors import ConfigError, RetrievalUnavailableError, ServiceUnavailableError
from searchrl.trainer.launch import (
    check_corpus,
    check_gpus,
    check_resume,
    prepare_launch,
    record_run,
    train_local,
)
from searchrl.trainer.overrides import main_ppo_command, render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import free_port
from tests.trainer.conftest import fixture_settings, forget_flash_attn, write_flash_attn


def _settings(tmp_path, qa_sample, urls, **kw):
    return fixture_settings(tmp_path, qa_sample, urls, health_deadline_s=2, **kw)  # a dead replica fails fast


NEW_DRIVER = "580.95.05"


@pytest.fixture(autouse=True)
def _cpu_torch(monkeypatch, flash_attn_2):
    """The driver check reads the lock, as with a CPU torch, whatever torch this machine has; flash-attn 2 stands
    in as installed, as on a GPU node (tests below take it away)."""
    monkeypatch.setattr("searchrl.trainer.launch.installed_cuda", lambda: None)


def test_no_gpu_so_launch_stops_first(tmp_path, qa_sample, monkeypatch):
    monkeypatch.setattr("searchrl.trainer.launch.count_gpus", lambda: 0)
    settings = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="no GPU on this machine"):
        train_local(settings, runner=lambda cmd: pytest.fail("must not start verl"))
    assert not (tmp_path / "data").exists()  # stopped before doing any work


def test_too_few_gpus_names_the_knob():
    with pytest.raises(ConfigError, match="set GPUS_PER_NODE=2"):
        check_gpus(TrainSettings(), found=2)
    assert check_gpus(TrainSettings(gpus_per_node=2, train_batch_size=8), found=4) == 4


@pytest.mark.live
def test_launch_on_a_gpu_node(tmp_path, qa_sample, live_bm25_url, monkeypatch, nvidia_smi):
    monkeypatch.setenv("RETRIEVAL_API_KEY", "tok-abc-123")
    dead = f"http://127.0.0.1:{free_port()}"
    settings = _settings(tmp_path, qa_sample, [dead, live_bm25_url])
    started = []
    smi = nvidia_smi(NEW_DRIVER)
    rc = train_local(settings, gpus=1, nvidia_smi=smi, runner=lambda cmd: started.append(cmd) or 0)

    assert rc == 0
    (cmd,) = started
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert cmd == main_ppo_command(settings, cmd[0], train_rows=20)
    assert settings.train_file.is_file() and settings.test_file.is_file()
    assert settings.resolved_tool_config_path.is_file()

    record = settings.run_dir / "searchrl"
    assert (record / "overrides.txt").read_text().splitlines() == render_overrides(settings, 20)
    saved = json.loads((record / "settings.json").read_text())
    assert saved["dataset_size"] == "small" and saved["retrieval_api_key_env"] == "RETRIEVAL_API_KEY"
    # The run record names the corpus and index the service answered from (its GET /).
    import httpx

    described = httpx.get(live_bm25_url + "/").json()
    run = json.loads((record / "run.json").read_text())
    assert run["corpus"]["corpus_checksum"] == described["corpus_checksum"] is not None
    assert run["corpus"]["index_fingerprint"] == described["index_fingerprint"] is not None
    assert run["corpus"]["corpus_size"] == 20 and run["nvidia_driver"] == NEW_DRIVER
    assert run["lock"] == "gpu-vllm-py311.txt"
    for path in record.iterdir():
        assert "tok-abc-123" not in path.read_text()


@pytest.mark.live
def test_failover_url_is_enough(tmp_path, qa_sample, live_bm25_url, nvidia_smi):
    plan = prepare_launch(
        _settings(tmp_path, qa_sample, [f"http://127.0.0.1:{free_port()}", live_bm25_url]),
        gpus=1,
        nvidia_smi=nvidia_smi(NEW_DRIVER),
    )
    assert plan.healthy_urls == [live_bm25_url]


def test_no_healthy_retrieval_stops_before_training(tmp_path, qa_sample, nvidia_smi):
    settings = _settings(tmp_path, qa_sample, [f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(RetrievalUnavailableError, match="no retrieval service answers") as info:
        train_local(
            settings,
            gpus=1,
            nvidia_smi=nvidia_smi(NEW_DRIVER),
            runner=lambda cmd: pytest.fail("must not start verl"),
        )
    assert "unreachable" in str(info.value)
    assert isinstance(info.value, ServiceUnavailableError) and info.value.exit_code == 75  # an outage
    assert not (settings.run_dir / "searchrl").exists()


# --- driver ------------------------------------------------------------------------------------------------------


def test_old_driver_stops_before_any_work(tmp_path, qa_sample, nvidia_smi):
    settings = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match=r"NVIDIA driver 550\.54\.15 is too old for CUDA 13\.0"):
        train_local(
            settings, gpus=1, nvidia_smi=nvidia_smi("550.54.15"), runner=lambda cmd: pytest.fail("no")
        )
    assert not (tmp_path / "data").exists()


def test_driver_is_checked_against_the_installed_torch_when_it_has_cuda(monkeypatch, nvidia_smi):
    from searchrl.trainer.launch import check_stack

    monkeypatch.setattr(
        "searchrl.trainer.launch.installed_cuda", lambda: (12, 8)
    )  # e.g. verl's image, not our lock
    assert check_stack(TrainSettings(), nvidia_smi=nvidia_smi("570.86.15")) == "570.86.15"
    with pytest.raises(
        ConfigError, match=r"driver 560\.35\.03 is too old for CUDA 12\.8 of the installed torch"
    ):
        check_stack(TrainSettings(), nvidia_smi=nvidia_smi("560.35.03"))


def _without_flash_attn(monkeypatch, root=None):
    """Take the stand-in flash-attn 2 away (and put `root`'s modules on sys.path instead)."""
    forget_flash_attn()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "flash_attn").exists()])
    if root is not None:
        monkeypatch.syspath_prepend(str(root))


def test_flash_attn_2_passes_the_stack_check(nvidia_smi, caplog):
    from searchrl.trainer.launch import check_stack

    caplog.set_level("INFO")
    assert check_stack(TrainSettings(), nvidia_smi=nvidia_smi(NEW_DRIVER)) == NEW_DRIVER
    assert "flash-attn 2.8.3+cu.13.0.torch.2.11 (FA2 CUDA extension and varlen kernels found)" in caplog.text


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ({"missing": True}, "FLASH_ATTN=1 but flash-attn is not installed"),
        ({"fa4_only": True}, "has no flash-attn 2 CUDA extension (flash_attn_2_cuda"),
        ({"extension": False}, "has no flash-attn 2 CUDA extension (flash_attn_2_cuda"),
        ({"varlen": False}, "has its CUDA extension but no flash_attn_varlen_func"),
    ],
    ids=["not-installed", "flash-attn-4-only", "no-extension", "no-varlen"],
)
def test_anything_but_flash_attn_2_is_refused_naming_flash_attn_0(
    monkeypatch, nvidia_smi, tmp_path, layout, says
):
    """An importable `flash_attn` is not enough: flash-attn-4's package (flash_attn/cute, a namespace package) has
    none of FA2's kernels. One line, naming the wheel and FLASH_ATTN=0 as the ways out."""
    from searchrl.trainer.launch import check_stack

    root = None if layout.get("missing") else write_flash_attn(tmp_path / "site", **layout)
    _without_flash_attn(monkeypatch, root)
    if layout.get("fa4_only"):
        import importlib

        assert importlib.import_module("flash_attn") is not None  # importable, as the old check accepted
    with pytest.raises(ConfigError) as caught:
        check_stack(TrainSettings(), nvidia_smi=nvidia_smi(NEW_DRIVER))
    line = str(caught.value)
    assert says in line and "FLASH_ATTN=0" in line and "\n" not in line
    assert check_stack(TrainSettings(flash_attn=False), nvidia_smi=nvidia_smi(NEW_DRIVER)) == NEW_DRIVER


# --- corpus ------------------------------------------------------------------------------------------------------


@pytest.mark.live
def test_search_r1_data_against_the_small_corpus_is_refused(tmp_path, live_bm25_url):
    settings = TrainSettings(data_dir=tmp_path, retrieval_urls=[live_bm25_url])  # the Search-R1 dataset
    with pytest.raises(ConfigError) as caught:
        check_corpus(settings, [live_bm25_url])
    message = str(caught.value)
    assert message.startswith("the retrieval service searches backend bm25, corpus ")
    assert "(20 passages), not wiki-18 (21,015,324 passages)" in message
    assert "ALLOW_SMALL_CORPUS=1" in message and "\n" not in message


@pytest.mark.live
def test_allow_small_corpus_lets_a_smoke_run_through(tmp_path, live_bm25_url, monkeypatch, caplog):
    monkeypatch.setenv("ALLOW_SMALL_CORPUS", "1")
    settings = TrainSettings(data_dir=tmp_path, retrieval_urls=[live_bm25_url])
    identity = check_corpus(settings, [live_bm25_url])
    assert identity.corpus_size == 20 and identity.corpus_checksum and identity.index_fingerprint
    assert "not wiki-18 (ALLOW_SMALL_CORPUS=1)" in caplog.text


def test_train_local_refuses_a_flat_wiki18_index_on_cpu(tmp_path, monkeypatch):
    """`searchrl train local` (make train-local) refuses what the plan and the nodes' setup refuse: a Flat index over
    wiki-18 searched on CPU cannot answer step 1's searches inside the tool's timeout. ALLOW_FLAT_INDEX=1 overrides."""
    flat = {"service": "searchrl-retrieval", "backend": "dense", "corpus": "wiki18", "corpus_size": 21_015_324,
            "index_type": "Flat", "device": "cpu", "corpus_checksum": "c", "index_fingerprint": "f"}  # fmt: skip
    monkeypatch.setattr("searchrl.trainer.launch.fetch_service_info", lambda url, key: flat)
    url = "http://127.0.0.1:9"
    with pytest.raises(ConfigError, match="with a Flat index on CPU.*ALLOW_FLAT_INDEX=1"):
        check_corpus(TrainSettings(data_dir=tmp_path, retrieval_urls=[url]), [url])
    monkeypatch.setenv("ALLOW_FLAT_INDEX", "1")
    assert check_corpus(TrainSettings(data_dir=tmp_path, retrieval_urls=[url]), [url]).index_type == "Flat"
    ivf = {**flat, "index_type": "IVF16384,SQ8"}
    monkeypatch.setattr("searchrl.trainer.launch.fetch_service_info", lambda url, key: ivf)
    monkeypatch.delenv("ALLOW_FLAT_INDEX")
    assert check_corpus(TrainSettings(data_dir=tmp_path, retrieval_urls=[url]), [url]).is_wiki18


def test_wiki18_and_other_data_pass_and_web_backends_do_not(caplog):
    from searchrl.retrieval.client.corpus_check import check_training_corpus, corpus_identity

    wiki = {"backend": "dense", "corpus": "/data/wiki-18.jsonl", "corpus_size": 21_015_324}
    assert check_training_corpus(corpus_identity(wiki), search_r1_data=True, allow_small=False).is_wiki18
    hybrid = {"backend": "hybrid", "parts": [{"backend": "dense", **wiki}, {"backend": "bm25", **wiki}]}
    assert corpus_identity(hybrid).is_wiki18 and corpus_identity(hybrid).backend == "hybrid"
    web = corpus_identity({"backend": "serper", "upstream": "https://google.serper.dev"})
    with pytest.raises(ConfigError, match="backend serper, corpus - \\(no corpus size\\), not wiki-18"):
        check_training_corpus(web, search_r1_data=True, allow_small=False)
    small = corpus_identity({"backend": "bm25", "corpus": "bundled", "corpus_size": 10_033})
    assert (
        check_training_corpus(small, search_r1_data=False, allow_small=False) is small
    )  # the user's own data


# --- resume ------------------------------------------------------------------------------------------------------


def _finish(settings, step: int, merged: bool = False) -> None:
    run = settings.run_dir.resolve()
    (run / f"global_step_{step}" / "actor").mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text(str(step))
    if merged:
        (run / "merged" / f"global_step_{step}").mkdir(parents=True)
        (run / "merged" / f"global_step_{step}" / "config.json").write_text("{}")


def test_resume_with_other_settings_is_refused_naming_the_fields(tmp_path, qa_sample, nvidia_smi):
    first = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"], total_steps=50, experiment_name="run")
    record_run(first, render_overrides(first, 20))
    _finish(first, 10)
    again = _settings(
        tmp_path, qa_sample, ["http://127.0.0.1:1"], total_steps=60, experiment_name="run", seed=7
    )
    with pytest.raises(ConfigError) as caught:
        train_local(again, gpus=1, nvidia_smi=nvidia_smi(NEW_DRIVER), runner=lambda cmd: pytest.fail("no"))
    message = str(caught.value)
    assert "holds a run started with other settings (seed 42 -> 7, total_steps 50 -> 60)" in message
    assert "set a new EXPERIMENT_NAME" in message and "\n" not in message
    # the same settings resume: a different retrieval URL or logger is not a different run
    state = check_resume(first.model_copy(update={"retrieval_urls": ["http://10.0.0.9:8000"]}))
    assert (state.step, state.finished) == (10, False)


def test_a_rehearsal_resumes_only_as_a_rehearsal(tmp_path):
    """REHEARSE_MULTI_NODE changes how the checkpoint is sharded (FSDP1 over 8 GPUs or FSDP2 HSDP 2 x 4), so a run
    resumes only with the same switch; a record written before the switch existed resumes as before."""
    rehearsal = TrainSettings(checkpoint_dir=tmp_path, experiment_name="r", rehearse_multi_node=True)
    record = record_run(rehearsal, render_overrides(rehearsal, 169_615))
    _finish(rehearsal, 10)
    assert check_resume(rehearsal).step == 10
    plain = TrainSettings(checkpoint_dir=tmp_path, experiment_name="r")
    with pytest.raises(ConfigError, match=r"other settings \(rehearse_multi_node True -> False\)"):
        check_resume(plain)
    saved = json.loads((record / "settings.json").read_text())
    del saved["rehearse_multi_node"]
    (record / "settings.json").write_text(json.dumps(saved))
    assert check_resume(plain).step == 10


def test_smoke_and_full_runs_never_share_a_folder(tmp_path):
    smoke = TrainSettings(checkpoint_dir=tmp_path, smoke=True)
    full = TrainSettings(checkpoint_dir=tmp_path)
    assert smoke.run_dir != full.run_dir
    record_run(smoke, [])
    _finish(smoke, 4)
    assert check_resume(full).step is None  # the full run starts fresh, not from the smoke checkpoint


def test_checkpoints_without_a_record_are_not_resumed(tmp_path):
    settings = TrainSettings(checkpoint_dir=tmp_path, experiment_name="old")
    _finish(settings, 100)
    with pytest.raises(ConfigError, match="holds checkpoints \\(step 100\\) but no searchrl/settings.json"):
        check_resume(settings)


def test_finished_run_is_not_trained_again(tmp_path, qa_sample, nvidia_smi, caplog):
    caplog.set_level("INFO", logger="searchrl.trainer.launch")
    settings = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"], total_steps=20)
    record_run(settings, [])
    _finish(settings, 20)
    smi = nvidia_smi(NEW_DRIVER)
    # finished, not merged yet: say so and let `searchrl train merge` (next in the YAML) merge it
    assert train_local(settings, gpus=1, nvidia_smi=smi, runner=lambda cmd: pytest.fail("no")) == 0
    assert "already finished at step 20 of 20: not training again" in caplog.text
    # finished and merged: nothing to do is an error, not a silent re-merge and exit 0
    (settings.run_dir / "merged" / "global_step_20").mkdir(parents=True)
    (settings.run_dir / "merged" / "global_step_20" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="already finished at step 20 of 20 and is merged in"):
        train_local(settings, gpus=1, nvidia_smi=smi, runner=lambda cmd: pytest.fail("no"))


def test_a_schedule_verl_would_cut_short_is_refused_before_training(tmp_path, qa_sample, nvidia_smi):
    settings = _settings(tmp_path, qa_sample, ["http://127.0.0.1:1"], total_steps=50, total_epochs=2)
    with pytest.raises(ConfigError, match="verl would stop at step 4 \\(2 epochs x 2 steps of 20 rows"):
        train_local(settings, gpus=1, nvidia_smi=nvidia_smi(NEW_DRIVER), runner=lambda cmd: pytest.fail("no"))
