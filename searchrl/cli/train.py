"""`searchrl train data|tool-config|overrides|run-dir|merge|local|lock`: the GPU run's verbs.

    searchrl train data --dataset-size small            # verl parquet from PeterJinGo/nq_hotpotqa_train
    searchrl train tool-config                          # the verl tool YAML for RETRIEVAL_SERVICE_URL
    searchrl train overrides                            # hydra overrides for verl.trainer.main_ppo, one per line
    searchrl train run-dir                              # <checkpoint_dir>/<experiment_name>: the run's folder
    searchrl train local                                # GPU check, data, health check, then verl (make train-local)
    searchrl train merge --run-dir checkpoints/my-run   # newest checkpoint -> Hugging Face folder
    searchrl train lock                                 # re-resolve requirements/gpu-*.txt with uv (make lock)
    searchrl train bench-step-checks                    # the driver's per-step loss-mask checks, timed

The CPU verbs (`searchrl train cpu ...`, `searchrl train bench-rollout`) are searchrl/cli/train_cpu.py's,
registered here so the command line is one.

Every knob is also an environment variable (DATASET_SIZE, MODEL_NAME, TRAIN_BATCH_SIZE, TOTAL_STEPS, NUM_NODES,
GPUS_PER_NODE, RETRIEVAL_SERVICE_URL, EXPERIMENT_NAME, CHECKPOINT_DIR, SEARCHRL_TRAIN_<FIELD>); flags win.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from searchrl.cli import given, learn_search, train_cpu
from searchrl.cli.flags import Handler, group, verb

if TYPE_CHECKING:
    from searchrl.trainer.settings import TrainSettings

# (flag, field, type, help) shared by every verb that builds TrainSettings.
_SETTINGS_FLAGS: list[tuple[str, str, type, str]] = [
    ("--dataset-size", "dataset_size", str, "small (1k/200) | medium (10k/2k) | full (env DATASET_SIZE)"),
    ("--qa-source", "qa_source", str, "HF dataset id or local parquet/JSONL file or folder"),
    ("--data-dir", "data_dir", str, "where verl parquet is written (default data/train)"),
    ("--seed", "seed", int, "sampling and shuffle seed (default 42)"),
    ("--model-name", "model_name", str, "HF model id or folder (env MODEL_NAME)"),
    (
        "--chat-template",
        "chat_template",
        str,
        "model (its own; refused if it drops tools) | searchrl (the repo's ChatML/hermes; env CHAT_TEMPLATE)",
    ),
    ("--train-batch-size", "train_batch_size", int, "prompts per step (env TRAIN_BATCH_SIZE)"),
    ("--rollout-n", "rollout_n", int, "GRPO samples per prompt (env ROLLOUT_N)"),
    ("--total-steps", "total_steps", int, "training steps (env TOTAL_STEPS)"),
    ("--max-turns", "max_turns", int, "searches per answer (env MAX_TURNS)"),
    ("--nnodes", "nnodes", int, "nodes (env NUM_NODES)"),
    ("--gpus-per-node", "gpus_per_node", int, "GPUs per node (env GPUS_PER_NODE)"),
    (
        "--experiment-name",
        "experiment_name",
        str,
        "run name (env EXPERIMENT_NAME; default from model/size/steps)",
    ),
    ("--checkpoint-dir", "checkpoint_dir", str, "runs live in <dir>/<experiment> (env CHECKPOINT_DIR)"),
    ("--tool-config-path", "tool_config_path", str, "where the verl tool YAML goes"),
]


def _add_settings_flags(p: argparse.ArgumentParser) -> None:
    for flag, dest, kind, text in _SETTINGS_FLAGS:
        p.add_argument(flag, dest=dest, type=kind, help=text)
    p.add_argument(
        "--retrieval-url",
        dest="retrieval_urls",
        action="append",
        help="retrieval service URL; repeat for failovers (env RETRIEVAL_SERVICE_URL, comma-separated)",
    )


def _settings_verb(
    verbs: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    text: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """A verb that builds TrainSettings: the settings flags, defaulting to SUPPRESS so env and .env keep their
    precedence where a flag is not given."""
    p = verb(verbs, name, handler, help=text)
    _add_settings_flags(p)
    return p


def _settings(args: argparse.Namespace) -> TrainSettings:
    from searchrl.config import load_settings
    from searchrl.trainer.settings import TrainSettings

    names = [dest for _, dest, _, _ in _SETTINGS_FLAGS] + ["retrieval_urls"]
    return load_settings(TrainSettings, **given(args, *names))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """prepare and run search-agent GRPO training on verl

    Data prep, verl tool config, hydra overrides, local launch and checkpoint merge.
    """
    verbs = group(sub, "train", register, dest="verb")

    p = _settings_verb(verbs, "data", "write verl train/test parquet", _data)
    p.add_argument("--force", action="store_true", help="rewrite even if matching files exist")
    p = _settings_verb(verbs, "tool-config", "write the verl tool YAML", _tool_config)
    p.add_argument("--output", help="path to write (default: settings' tool_config_path)")
    _settings_verb(verbs, "overrides", "print verl hydra overrides, one per line", _overrides)
    _settings_verb(
        verbs,
        "run-dir",
        "print the run's folder, <checkpoint_dir>/<experiment_name> (checkpoints, record, merged model)",
        _run_dir,
    )
    _settings_verb(verbs, "local", "train on this machine's GPUs (make train-local)", _local)
    p = _settings_verb(verbs, "merge", "merge the newest checkpoint into a HF model", _merge)
    p.add_argument(
        "--run-dir", dest="run_dir", help="run folder (default <checkpoint_dir>/<experiment_name>)"
    )
    p.add_argument(
        "--target-dir", dest="target_dir", help="output folder (default <run>/merged/global_step_N)"
    )
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip loading the result")
    p.add_argument(
        "--wait",
        dest="checkpoint_wait_s",
        type=float,
        help="seconds to wait for every rank's shard (env SEARCHRL_TRAIN_CHECKPOINT_WAIT_S, default 600)",
    )

    train_cpu.register(verbs)
    learn_search.register(verbs)

    p = verb(verbs, "bench-step-checks", _bench_step_checks, suppress=False)
    p.add_argument(
        "model",
        nargs="?",
        default="smollm2-135m",
        help="whose tokenizer: a known model name (got as `searchrl model get` gets it) or a Hugging Face "
        "folder (default %(default)s)",
    )
    p.add_argument("--trajectories", type=int, default=2560, help="in the step (default %(default)s)")
    p.add_argument("--tokens", type=int, default=1500, help="response tokens each (default %(default)s)")
    p.add_argument(
        "--repeats", type=int, default=5, help="timed runs; the median is reported (default %(default)s)"
    )
    p.add_argument(
        "--no-string-path",
        dest="string_path",
        action="store_false",
        help="skip the old string path (its time, and the check that it counts the same; ~4 s at the defaults)",
    )

    verb(verbs, "lock", _lock)


def _data(args: argparse.Namespace) -> int:
    from searchrl.logs import setup_logging
    from searchrl.trainer.data import prepare_data

    setup_logging()
    result = prepare_data(_settings(args), force=getattr(args, "force", False))
    print(result.train_file)  # noqa: T201
    print(result.test_file)  # noqa: T201
    return 0


def _tool_config(args: argparse.Namespace) -> int:
    from pathlib import Path

    from searchrl.logs import setup_logging
    from searchrl.trainer.toolconfig import write_tool_config

    setup_logging()
    output = getattr(args, "output", None)
    print(write_tool_config(_settings(args), Path(output) if output else None))  # noqa: T201
    return 0


def _overrides(args: argparse.Namespace) -> int:
    from searchrl.trainer.overrides import render_overrides

    for line in render_overrides(_settings(args)):
        print(line)  # noqa: T201
    return 0


def _run_dir(args: argparse.Namespace) -> int:
    """One line, for scripts: sky/train.yaml's crash guard reads the run's checkpoints there."""
    print(_settings(args).run_dir)  # noqa: T201
    return 0


def _local(args: argparse.Namespace) -> int:
    from searchrl.logs import setup_logging
    from searchrl.trainer.launch import train_local

    setup_logging()
    return train_local(_settings(args))


def _merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from searchrl.logs import setup_logging
    from searchrl.trainer.merge import merge_latest

    setup_logging()
    settings = _settings(args)
    run_dir = Path(args.run_dir) if hasattr(args, "run_dir") else settings.run_dir
    target = Path(args.target_dir) if hasattr(args, "target_dir") else None
    wait_s = getattr(args, "checkpoint_wait_s", settings.checkpoint_wait_s)
    result = merge_latest(run_dir, target, verify=getattr(args, "verify", True), wait_s=wait_s)
    print(result.target_dir)  # noqa: T201
    return 0


def _bench_step_checks(args: argparse.Namespace) -> int:
    """the driver's loss-mask checks of one GPU training step, now vs the string path before (make bench-step-checks)

    Build a step of 2,560 trajectories x 1,500 tokens with the model's tokenizer (assistant turns, tool calls,
    bundled passages in <tool_response> blocks, made-up ones in the model's turn, loss masks and generated-span
    records to match), time what the sampler runs on it every step, and once the string path it ran before,
    which must count the same. Prints the CPU, the load and `step checks: X.XX s a step at T x N tokens`.
    """
    import os

    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging
    from searchrl.retrieval.encoders.tuning import cpu_info
    from searchrl.trainer.mask_bench import bench_step_checks

    setup_logging()
    if min(args.trajectories, args.tokens, args.repeats) < 1:
        raise ConfigError("--trajectories, --tokens and --repeats must be at least 1")
    load = os.getloadavg()[0]
    result = bench_step_checks(
        args.model,
        trajectories=args.trajectories,
        tokens=args.tokens,
        repeats=args.repeats,
        string_path=args.string_path,
    )
    info = cpu_info()
    loads = f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    print(result.report(f"{info['model']} ({info['cores']} cores; {loads})"))  # noqa: T201
    return 0


def _lock(args: argparse.Namespace) -> int:
    """re-resolve the GPU locks in requirements/ with uv (make lock)

    uv pip compile requirements/gpu-<engine>.in + the train/retrieval extras for Linux x86_64, Python 3.11 and
    3.12, with hashes. Needs PyPI, no GPU.
    """
    from searchrl.logs import setup_logging
    from searchrl.trainer.lockfiles import write_locks

    setup_logging()
    for path in write_locks():
        print(path)  # noqa: T201
    return 0
