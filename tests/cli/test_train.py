"""`searchrl train ...`: flags reach the library, results go to stdout, errors are one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings


def test_overrides_prints_one_per_line(capsys, monkeypatch):
    monkeypatch.setenv("TOTAL_STEPS", "20")
    rc = main(
        [
            "train",
            "overrides",
            "--dataset-size",
            "small",
            "--retrieval-url",
            "http://a:1",
            "--retrieval-url",
            "http://b:2",
            "--train-batch-size",
            "64",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    expected = TrainSettings(
        dataset_size="small", retrieval_urls=["http://a:1", "http://b:2"], train_batch_size=64
    )
    assert out == render_overrides(expected)
    assert "trainer.total_training_steps=20" in out  # env still applies where no flag was given


def test_data_and_tool_config(tmp_path, capsys, qa_sample):
    rc = main(
        [
            "train",
            "data",
            "--qa-source",
            str(qa_sample),
            "--data-dir",
            str(tmp_path),
            "--dataset-size",
            "small",
        ]
    )
    train, test = capsys.readouterr().out.split()
    assert rc == 0 and Path(train).is_file() and Path(test).is_file()

    out = tmp_path / "tools.yaml"
    rc = main(["train", "tool-config", "--output", str(out), "--retrieval-url", "http://10.1.2.3:8000"])
    assert rc == 0 and capsys.readouterr().out.strip() == str(out.resolve())
    assert "http://10.1.2.3:8000" in out.read_text()


def test_merge_passes_flags(tmp_path, capsys, monkeypatch):
    import searchrl.trainer.merge
    from searchrl.trainer.merge import MergeResult

    seen = {}

    def fake_merge(run_dir, target_dir=None, *, verify=True, wait_s=0.0):
        seen.update(run_dir=run_dir, target_dir=target_dir, verify=verify, wait_s=wait_s)
        return MergeResult(
            step=3,
            actor_dir=run_dir / "global_step_3" / "actor",
            target_dir=tmp_path / "hf",
            num_parameters=None,
        )

    monkeypatch.setattr(searchrl.trainer.merge, "merge_latest", fake_merge)
    rc = main(
        [
            "train",
            "merge",
            "--run-dir",
            str(tmp_path / "run"),
            "--target-dir",
            str(tmp_path / "hf"),
            "--no-verify",
            "--wait",
            "60",
        ]
    )
    assert rc == 0 and capsys.readouterr().out.strip() == str(tmp_path / "hf")
    assert seen == {
        "run_dir": tmp_path / "run",
        "target_dir": tmp_path / "hf",
        "verify": False,
        "wait_s": 60.0,
    }

    seen.clear()
    main(["train", "merge", "--checkpoint-dir", str(tmp_path / "ck"), "--experiment-name", "e1"])
    assert seen == {"run_dir": tmp_path / "ck" / "e1", "target_dir": None, "verify": True, "wait_s": 600.0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "local"], "error: no GPU on this machine"),
        (["train", "overrides", "--dataset-size", "huge"], "error: dataset_size"),
        (["train", "overrides", "--train-batch-size", "3"], "divisible by the GPU count"),
        (
            ["train", "overrides", "--dataset-size", "small", "--train-batch-size", "2048"],
            "error: 1000 train rows (DATASET_SIZE=small) make no full batch of TRAIN_BATCH_SIZE=2048",
        ),
        (["train", "data", "--qa-source", "./missing.jsonl"], "error: QA file missing.jsonl does not exist"),
        (["train", "merge", "--run-dir", "/nonexistent/run"], "error: no latest_checkpointed_iteration.txt"),
        (
            ["train", "cpu", "real", "--model", "./no-model"],
            "error: no-model is not a Hugging Face model folder",
        ),
        (["train", "overrides", "--chat-template", "hermes"], "error: chat_template"),
        (["train", "bench-rollout", "./no-model", "--sequences", "0"], "error: --sequences and --max-tokens"),
        (
            ["train", "cpu", "learn", "--trainer-mode", "separate_async", "--seeds", "0"],
            "error: --seeds 0: --trainer-mode separate_async judges the rise on the mean over at least 3 seeds",
        ),
        (
            ["train", "cpu", "learn", "--beside-sync"],
            "error: --beside-sync compares an async mode with sync",
        ),
        (
            ["train", "cpu", "learn", "--trainer-mode", "async"],
            "error: --trainer-mode 'async': the CPU run takes sync",
        ),
    ],
)
def test_errors_are_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("searchrl.trainer.launch.count_gpus", lambda: 0)  # the same answer on a GPU machine
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_old_mode_flag_is_an_alias_of_trainer_mode_that_says_so(capsys, monkeypatch):
    """`--mode` (the name before issue 47's one name per knob) sets the same value for one release, with a
    one-line notice; the value then meets the same check as --trainer-mode's."""
    import searchrl.trainer.proofs.train_cpu

    seen: dict[str, object] = {}

    def fake_run(out, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)  # stop before anything starts

    monkeypatch.setattr(searchrl.trainer.proofs.train_cpu, "run_cpu_smoke", fake_run)
    with pytest.raises(SystemExit):
        main(["train", "cpu", "--mode", "colocate_async"])
    assert seen["mode"] == "colocate_async"
    notice = capsys.readouterr().err.strip().splitlines()
    assert notice == [
        "notice: --mode is an alias of --trainer-mode, kept for one release; use --trainer-mode"
    ]

    assert main(["train", "cpu", "learn", "--mode", "async"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        notice[0],
        "error: --trainer-mode 'async': the CPU run takes sync, colocate_async, separate_async",
    ]

    with pytest.raises(SystemExit):
        main(["train", "cpu", "--help"])
    assert "--trainer-mode TRAINER_MODE" in capsys.readouterr().out


def test_bare_train_shows_help(capsys):
    assert main(["train"]) == 2
    assert "overrides" in capsys.readouterr().err


def test_lock_prints_the_written_locks_and_fails_in_one_line(capsys, monkeypatch):
    from searchrl.errors import ConfigError

    monkeypatch.setattr(
        "searchrl.trainer.lockfiles.write_locks", lambda: [Path("requirements/gpu-vllm-py311.txt")]
    )
    assert main(["train", "lock"]) == 0
    assert capsys.readouterr().out.splitlines() == ["requirements/gpu-vllm-py311.txt"]

    def no_solution():
        raise ConfigError("requirements/gpu-vllm-py311.txt does not resolve: No solution found ...")

    monkeypatch.setattr("searchrl.trainer.lockfiles.write_locks", no_solution)
    assert main(["train", "lock"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: requirements/gpu-vllm-py311.txt does not resolve: No solution found ..."
    )
