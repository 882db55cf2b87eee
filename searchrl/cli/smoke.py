"""`searchrl smoke`: download, serve, health-check, score and eval (scripted model) one corpus (CI's smoke job).

    searchrl smoke                                     # bundled corpus + bm25, offline (= make smoke)
    searchrl smoke --corpus wiki18-100k --backend dense --encoder intfloat/e5-base-v2 --require-download

Prints a step table on stdout and writes <out>/smoke.json; exit 0 when no step failed (a corpus whose download
the machine cannot reach is reported as skipped, unless --require-download), else exit 2 naming the step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from searchrl.cli.flags import verb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "smoke", _smoke, suppress=False)
    p.add_argument("--corpus", default="bundled", help="bundled | wiki18-100k | wiki18 | JSONL path")
    p.add_argument("--backend", default="bm25", help="bm25 | dense | hybrid (default bm25)")
    p.add_argument("--encoder", default=None, help="dense encoder (e.g. intfloat/e5-base-v2 for wiki18-100k)")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="corpora and indexes (default ./data)")
    p.add_argument("--qa", type=Path, default=None, help="QA JSONL with supporting_titles (bundled: dev set)")
    p.add_argument("--questions", type=int, default=20, help="known-item questions when no QA file applies")
    p.add_argument("--k", type=int, default=3, help="top-k passages scored per question")
    p.add_argument("--min-recall", type=float, default=0.6, help="fail below this recall@k (default 0.6)")
    p.add_argument(
        "--eval-questions",
        type=int,
        default=10,
        help="questions `searchrl eval` runs with a scripted model (a pipeline check; 0 skips; default 10)",
    )
    p.add_argument("--require-download", action="store_true", help="an unreachable Hub fails the run")
    p.add_argument("--deadline", type=float, default=900.0, help="seconds for the service to answer")
    p.add_argument("--out", type=Path, default=Path("outputs/smoke"), help="where smoke.json and logs go")


def _smoke(args: argparse.Namespace) -> int:
    """end-to-end smoke test of a corpus: download, serve, health, recall, eval with a scripted model

    `searchrl smoke`: download, serve, health-check, score and eval (scripted model) one corpus (CI's smoke
    job).
    """
    from searchrl.deploy.smoke import run_smoke, write_report
    from searchrl.errors import ConfigError, SearchRLError
    from searchrl.logs import setup_logging

    setup_logging()
    if args.k < 1 or args.questions < 1:
        raise ConfigError("--k and --questions must be at least 1")
    if args.eval_questions < 0:
        raise ConfigError(f"--eval-questions must be 0 (skip) or more, got {args.eval_questions}")
    if not 0.0 <= args.min_recall <= 1.0:
        raise ConfigError(f"--min-recall is a share between 0 and 1, got {args.min_recall}")
    report = run_smoke(
        corpus=args.corpus,
        backend=args.backend,
        encoder=args.encoder,
        data_dir=args.data_dir,
        qa=args.qa,
        questions=args.questions,
        k=args.k,
        min_recall=args.min_recall,
        eval_questions=args.eval_questions,
        require_download=args.require_download,
        start_deadline_s=args.deadline,
        out_dir=args.out,
    )
    sys.stdout.write(report.table() + "\n")
    path = write_report(report, args.out)
    sys.stdout.write(f"report: {path}\n")
    failed = [s for s in report.steps if s.status == "failed"]
    if failed:
        raise SearchRLError(f"smoke step {failed[0].name!r} failed: {failed[0].detail}")
    return 0
