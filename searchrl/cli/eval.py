"""`searchrl eval` and `searchrl compare`: evaluate the search agent and compare runs.

    searchrl eval --model Qwen/Qwen2.5-3B-Instruct --llm-url http://127.0.0.1:30000/v1 \\
        --retrieval-url http://127.0.0.1:8000 --qa dev
    searchrl eval --no-search --qa searchr1-test --datasets nq,hotpotqa --limit 500
    searchrl compare results/ --out reports/            # refuses mismatched questions/protocols, invalid runs
    searchrl compare results/ --baseline "base-3b, wiki18, search" --allow-question-diff
    searchrl compare --models base@http://h:30000/v1,trained@http://h:30001/v1 \\
        --backends wiki=http://h:8000,google=http://h:8001 --tools on,off --qa dev --out reports/

API keys come from the environment only (SEARCHRL_INFER_LLM_API_KEY, RETRIEVAL_API_KEY), never from flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from searchrl.cli import given
from searchrl.cli.flags import verb

# flags shared by eval and compare -> InferSettings fields
_SHARED = [
    "tokenizer",
    "engine",
    "api",
    "llm_url",
    "wait_for_llm_s",
    "device",
    "local_threads",
    "sglang_command",
    "sglang_args",
    "temperature",
    "top_p",
    "seed",
    "sample_seed",
    "max_tokens_per_turn",
    "max_prompt_tokens",
    "max_response_tokens",
    "max_parallel_calls",
    "prompt_format",
    "chat_template",
    "max_failure_rate",
    "retry_failed",
    "stop_when_invalid",
    "max_consecutive_failures",
    "max_observation_tokens",
    "deterministic",
    "stop_after_tool_call",
    "max_turns",
    "topk",
    "passage_max_chars",
    "max_observation_chars",
    "malformed_feedback",
    "concurrency",
    "qa",
    "datasets",
    "limit",
    "output_dir",
]


def _add_shared(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", help="HF id or folder whose chat template renders prompts (default: --model)"
    )
    p.add_argument(
        "--engine",
        help="server (a running OpenAI-compatible sglang/vLLM) | sglang (start sglang.launch_server, GPU) | "
        "local (HF transformers)",
    )
    p.add_argument(
        "--sglang-command",
        dest="sglang_command",
        help="engine sglang: default '<this python> -m sglang.launch_server'",
    )
    p.add_argument(
        "--sglang-args",
        dest="sglang_args",
        help="engine sglang: extra flags, e.g. '--mem-fraction-static 0.6' (--sampling-defaults openai and "
        "--enable-deterministic-inference are added unless given)",
    )
    p.add_argument(
        "--no-deterministic",
        dest="deterministic",
        action="store_false",
        help="engine sglang: leave out --enable-deterministic-inference (faster; runs are then not "
        "token-reproducible, greedy or seeded)",
    )
    p.add_argument("--api", help="completions (exact training template, default) | chat (server renders)")
    p.add_argument(
        "--llm-url", dest="llm_url", help="OpenAI-compatible base URL (default http://127.0.0.1:30000/v1)"
    )
    p.add_argument(
        "--wait-for-llm",
        dest="wait_for_llm_s",
        type=float,
        metavar="SECONDS",
        help="wait up to this long for the LLM server to answer (still loading weights); "
        "default 0: a refused connection fails at once",
    )
    p.add_argument("--device", help="local engine: auto | cpu | cuda")
    p.add_argument(
        "--local-threads",
        dest="local_threads",
        type=int,
        help="local engine: torch threads (default 0 = all cores; on a busy shared machine 1 can be faster)",
    )
    p.add_argument("--temperature", type=float, help="0 = greedy (default)")
    p.add_argument("--top-p", dest="top_p", type=float, help="nucleus sampling (default 1.0)")
    p.add_argument("--seed", type=int, help="decoding seed sent with every request (default 0)")
    p.add_argument(
        "--sample-seed", dest="sample_seed", type=int, help="which questions --limit picks (default 0)"
    )
    p.add_argument(
        "--max-tokens-per-turn",
        dest="max_tokens_per_turn",
        type=int,
        help="per-turn cap (default none: training's rule, what is left of the budget)",
    )
    p.add_argument(
        "--max-prompt-tokens", dest="max_prompt_tokens", type=int, help="as training (default 1024)"
    )
    p.add_argument(
        "--max-response-tokens",
        dest="max_response_tokens",
        type=int,
        help="whole trajectory after the prompt, observations included, as training (default 4096)",
    )
    p.add_argument(
        "--max-parallel-calls",
        dest="max_parallel_calls",
        type=int,
        help="tool calls run per turn, as training (default 1)",
    )
    p.add_argument(
        "--prompt-format",
        dest="prompt_format",
        help="searchrl (hermes tool calls, default) | search-r1 (<search> tags, for Search-R1's released "
        "checkpoints, evaluated as Search-R1 did: 500 tokens per turn, observations cut at 500 tokens)",
    )
    p.add_argument(
        "--chat-template",
        dest="chat_template",
        help="model (the tokenizer's own; refused when it ignores tools=, default) | searchrl (the repo's "
        "ChatML/hermes tool template, for ChatML models whose template has no tool support)",
    )
    p.add_argument(
        "--max-observation-tokens",
        dest="max_observation_tokens",
        type=int,
        help="search-r1 format: observation cut to this many tokens (default 500, Search-R1's max_obs_length)",
    )
    p.add_argument(
        "--max-failure-rate",
        dest="max_failure_rate",
        type=float,
        help="share of questions with a search failure or LLM error, over the run or in any one dataset, that "
        "marks the run invalid (default 0.02); the model's own malformed calls never count",
    )
    p.add_argument(
        "--retry-failed",
        dest="retry_failed",
        action="store_true",
        help="re-run the questions whose search failed or whose request the LLM refused, replacing their "
        "records (after an outage)",
    )
    p.add_argument(
        "--keep-going",
        dest="stop_when_invalid",
        action="store_false",
        help="finish the run even once failures make it invalid (default: stop there, keeping what is done)",
    )
    p.add_argument(
        "--max-consecutive-failures",
        dest="max_consecutive_failures",
        type=int,
        help="stop after this many failed searches in a row, a backend that is down (default 20; 0 = never)",
    )
    p.add_argument(
        "--stop-after-tool-call",
        dest="stop_after_tool_call",
        action="store_true",
        help="also stop at </tool_call>",
    )
    p.add_argument(
        "--max-turns",
        dest="max_turns",
        type=int,
        help="searching turns per question, as training's MAX_TURNS (default 4)",
    )
    p.add_argument("--topk", type=int, help="passages per search query (default 3)")
    p.add_argument(
        "--passage-max-chars", dest="passage_max_chars", type=int, help="per passage (default 800)"
    )
    p.add_argument(
        "--max-observation-chars",
        dest="max_observation_chars",
        type=int,
        help="whole observation (default: the trainer's budget, topk x (passage + 96) + 96)",
    )
    p.add_argument(
        "--malformed-feedback",
        dest="malformed_feedback",
        action="store_true",
        help="tell the model why a tool call failed to parse (training ends the episode instead)",
    )
    p.add_argument("--concurrency", type=int, help="questions in flight (default 16)")
    p.add_argument("--qa", help="dev | searchr1-test | path to .jsonl/.parquet (default dev)")
    p.add_argument("--datasets", help="comma-separated data_source filter, e.g. nq,hotpotqa")
    p.add_argument(
        "--limit",
        type=int,
        help="questions per dataset, sampled with --sample-seed per dataset (a run split by dataset draws "
        "the same ones)",
    )
    p.add_argument("--output-dir", dest="output_dir", help="where result JSON files go (default ./results)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "eval", _eval)
    p.add_argument("--model", help="served model name (server) or HF id/folder (local)")
    p.add_argument("--label", help="run name in reports (default: 'model, backend, search')")
    p.add_argument("--no-search", dest="search", action="store_false", help="the no-search baseline")
    p.add_argument("--retrieval-url", dest="retrieval_url", help="retrieval service URL(s), comma-separated")
    _add_shared(p)

    c = verb(sub, "compare", _compare)
    c.add_argument("results", nargs="*", help="result files or directories from `searchrl eval`")
    c.add_argument("--models", help="run the matrix: NAME[@LLM_URL],... ")
    c.add_argument("--backends", help="LABEL=RETRIEVAL_URL,... (one retrieval service per backend)")
    c.add_argument("--tools", help="on,off (default both)")
    c.add_argument("--out", help="report directory (default ./reports)")
    c.add_argument("--title", help="report title")
    c.add_argument(
        "--baseline",
        metavar="RUN",
        help="compare every run with this one (its label, or a unique part of it); default: the contrasts a "
        "paper reports (model vs model within a retrieval, retrieval vs retrieval and search vs no search within "
        "a model)",
    )
    c.add_argument(
        "--allow-protocol-diff",
        dest="allow_protocol_diff",
        action="store_true",
        help="compare runs whose rules or decoding differ; the differences head the report as a banner",
    )
    c.add_argument(
        "--allow-question-diff",
        dest="allow_question_diff",
        action="store_true",
        help="compare runs over different question sets (paired tests use the shared questions); the "
        "differences head the report as a banner",
    )
    c.add_argument("--force", action="store_true", help=argparse.SUPPRESS)  # removed: says what replaced it
    c.add_argument(
        "--allow-invalid",
        dest="allow_invalid",
        action="store_true",
        help="include runs marked invalid (too many failures, aborted); they are flagged in every table",
    )
    _add_shared(c)

    b = verb(sub, "eval-budget", _eval_budget)
    b.add_argument("--runs", type=int, default=1, help="evaluation runs that search this backend (default 1)")
    b.add_argument(
        "--queries-per-call",
        dest="queries_per_call",
        type=int,
        help="queries per search call, each one upstream request (default 3 for the searchrl format, whose "
        "query_list may hold several; 1 for search-r1)",
    )
    b.add_argument(
        "--prompt-format",
        dest="prompt_format",
        help="as for eval: search-r1 sends one query per search",
    )
    b.add_argument(
        "--health-queries",
        dest="health_queries",
        type=int,
        default=1,
        help="real searches the deployment makes itself, e.g. `searchrl health` on the service (default 1)",
    )
    b.add_argument(
        "--retry-share",
        dest="retry_share",
        type=float,
        default=0.1,
        help="room for upstream retries, which the service's budget counts too (default 0.1 = 10%%)",
    )
    b.add_argument(
        "--price-per-1k",
        dest="price_per_1k",
        type=float,
        default=1.0,
        help="your plan's price per 1,000 requests",
    )
    for flag in ("--qa", "--datasets", "--limit", "--sample-seed", "--max-turns", "--max-parallel-calls"):
        dest = flag[2:].replace("-", "_")
        b.add_argument(
            flag, dest=dest, type=int if dest not in ("qa", "datasets") else str, help="as for eval"
        )


def _eval(args: argparse.Namespace) -> int:
    """run a QA set through the search agent and score it

    Run a QA set through the search agent (or the no-search baseline) and write one result file with answers,
    EM/F1, searches, turns, transcripts and the protocol.
    """
    from searchrl.config import load_settings
    from searchrl.errors import InvalidRunError
    from searchrl.infer.evaluate import run_eval
    from searchrl.infer.settings import InferSettings
    from searchrl.infer.summary import failure_cell, paper_table
    from searchrl.logs import setup_logging

    setup_logging()
    settings = load_settings(
        InferSettings, **given(args, "model", "label", "search", "retrieval_url", *_SHARED)
    )
    path, result = run_eval(settings)
    print(paper_table([result]))  # noqa: T201  (stdout carries results)
    print(f"wrote {path}", file=sys.stderr)  # noqa: T201
    if not result["summary"]["valid"]:
        raise InvalidRunError(
            f"run INVALID, do not quote it: {result['summary']['invalid_reason']} (search failures by kind: "
            f"{failure_cell(result['summary'])}; details in {path}); once the backend is healthy, re-run the "
            "same command with --retry-failed to re-run only the failed questions"
        )
    return 0


def _eval_budget(args: argparse.Namespace) -> int:
    """print the web search budget (requests) an evaluation needs, with its cost, before running it

    Worst-case upstream requests of RUNS evaluations over the selected questions (every searching turn used,
    no cache hits, +1 pre-flight per run). The number goes to stdout, for SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET;
    the explanation and the cost estimate go to stderr.
    """
    from searchrl.config import load_settings
    from searchrl.errors import ConfigError
    from searchrl.infer.budget import plan_search_budget
    from searchrl.infer.qa import load_qa
    from searchrl.infer.settings import InferSettings

    s = load_settings(
        InferSettings,
        **given(
            args, "qa", "datasets", "limit", "sample_seed", "max_turns", "max_parallel_calls", "prompt_format"
        ),
    )
    items, _ = load_qa(s.qa, datasets=s.dataset_filter, limit=s.limit, seed=s.sample_seed)
    per_call = getattr(args, "queries_per_call", 1 if s.prompt_format == "search-r1" else 3)
    try:
        budget = plan_search_budget(
            len(items),
            runs=args.runs,
            max_turns=s.max_turns,
            max_parallel_calls=s.max_parallel_calls,
            queries_per_call=per_call,
            price_per_1k=args.price_per_1k,
            health_queries=args.health_queries,
            retry_share=args.retry_share,
        )
    except ValueError as exc:
        raise ConfigError(f"eval-budget: {exc}") from None
    print(budget.describe(), file=sys.stderr)  # noqa: T201
    print(budget.requests)  # noqa: T201  (stdout: the number, for SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET)
    return 0


def _compare(args: argparse.Namespace) -> int:
    """compare evaluation runs in one report (Markdown + HTML)

    Build a report over result files, or first run the matrix models x backends x tools.
    """
    from searchrl.config import load_settings
    from searchrl.errors import ConfigError
    from searchrl.infer.comparison import check_comparable
    from searchrl.infer.report import build_report
    from searchrl.infer.report_tables import compare_table
    from searchrl.infer.runs import load_runs, parse_backends, parse_models, parse_tools, run_matrix
    from searchrl.infer.settings import InferSettings
    from searchrl.logs import setup_logging

    setup_logging()
    if getattr(args, "force", False):
        raise ConfigError(
            "--force is gone: pass --allow-protocol-diff (rules/decoding differ) and/or --allow-question-diff "
            "(question sets differ); the report then lists the differences in a banner"
        )
    paths = [Path(p) for p in getattr(args, "results", [])]
    if hasattr(args, "models"):
        tools = parse_tools(getattr(args, "tools", "on,off"))
        backends = parse_backends(args.backends) if hasattr(args, "backends") else []
        if any(tools) and not backends:
            raise ConfigError("--tools on needs --backends LABEL=URL,...")
        base = load_settings(InferSettings, **given(args, *_SHARED))
        paths += run_matrix(base, parse_models(args.models), backends, tools)
    elif not paths:
        raise ConfigError("give result files/directories, or --models and --backends to run the matrix")
    runs = load_runs(paths)
    banner = check_comparable(
        runs,
        allow_protocol_diff=getattr(args, "allow_protocol_diff", False),
        allow_question_diff=getattr(args, "allow_question_diff", False),
        allow_invalid=getattr(args, "allow_invalid", False),
    )
    out = Path(getattr(args, "out", "reports"))
    report = build_report(runs, out, banner=banner, **given(args, "title", "baseline"))  # type: ignore[arg-type]
    for line in banner:
        print(f"warning: {line}", file=sys.stderr)  # noqa: T201
    print(compare_table(runs))  # noqa: T201
    print(f"wrote {report['markdown']} and {report['html']}", file=sys.stderr)  # noqa: T201
    return 0


__all__ = ["register"]
