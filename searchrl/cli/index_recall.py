"""`searchrl index recall`: recall@k by supporting title of dense, BM25 and hybrid on a QA set.

    searchrl index recall                                    # dense, bm25, hybrid on the dev set; k=3
    searchrl index recall --backends hybrid --k 5 --json out.json
    searchrl index recall --rrf-k 20 --bm25-weight 0.5       # try fusion settings

Builds the bundled indexes under --data-dir on first use. Prints a Markdown table on stdout; logs and progress
go to stderr. Other settings come from the environment (SEARCHRL_RETRIEVAL_*) as for the server.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from searchrl.cli.flags import verb
from searchrl.devset import dev_qa_path

DEFAULT_QA = dev_qa_path()


def register_recall(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "recall", _recall, suppress=False)
    p.add_argument("--backends", default="dense,bm25,hybrid", help="comma-separated backend names")
    p.add_argument("--k", type=int, default=3, help="top-k passages scored per question")
    p.add_argument("--qa", type=Path, default=DEFAULT_QA, help="QA JSONL with supporting_titles")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="corpora and indexes")
    p.add_argument("--corpus", default="bundled", help="bundled or a Search-R1 JSONL path")
    p.add_argument("--rrf-k", type=float, default=argparse.SUPPRESS, help="hybrid RRF constant")
    p.add_argument("--dense-weight", type=float, default=argparse.SUPPRESS, help="hybrid dense weight")
    p.add_argument("--bm25-weight", type=float, default=argparse.SUPPRESS, help="hybrid BM25 weight")
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")


def _recall(args: argparse.Namespace) -> int:
    """recall@k by supporting title of dense, bm25 and hybrid on a QA set

    `searchrl index recall`: recall@k by supporting title of dense, BM25 and hybrid on a QA set.
    """
    from searchrl.config import load_settings
    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging
    from searchrl.retrieval.index.recall import as_dict, format_table, load_qa, measure_recall, pairwise_table
    from searchrl.retrieval.settings import RetrievalSettings

    setup_logging()
    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, got {args.k}")
    hybrid = {
        f"hybrid_{name}": getattr(args, name)
        for name in ("rrf_k", "dense_weight", "bm25_weight")
        if hasattr(args, name)
    }
    rows = load_qa(args.qa)
    results = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        settings = load_settings(
            RetrievalSettings,
            backend=backend,
            data_dir=args.data_dir,
            corpus=args.corpus,
            cache_mode="off",
            **hybrid,
        )
        results.append(measure_recall(settings, rows, args.k))
    sys.stdout.write(format_table(results) + "\n")
    if len(results) > 1:  # rank backends only where the paired test separates them
        sys.stdout.write("\n" + pairwise_table(results) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([as_dict(r) for r in results], indent=2) + "\n")
    return 0
