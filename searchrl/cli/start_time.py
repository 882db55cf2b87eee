"""`searchrl sky start-time`: measure a retrieval replica's start from a prebuilt index (what `make bench-start` runs).

    searchrl sky start-time                          # bundled bm25 + dense, the 100k stand-in; outputs/start-time/
    searchrl sky start-time --backends bm25 --no-standin

Prints a Markdown table naming the CPU on stdout; JSON goes to `<work>/start-time.json`. Code in
searchrl/bench/start_time.py; docs/deploy.md section 6 quotes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from searchrl.cli.flags import verb


def register_start_time(verbs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(verbs, "start-time", _start_time, suppress=False)
    p.add_argument(
        "--work", type=Path, default=Path("outputs/start-time"), help="work folder (default %(default)s)"
    )
    p.add_argument("--backends", default="bm25,dense", help="bundled backends to time (default %(default)s)")
    p.add_argument("--no-standin", dest="standin", action="store_false", help="skip the wiki18-100k stand-in")


def _start_time(args: argparse.Namespace) -> int:
    """measure replica start from an index bucket stand-in: copy, then serve to the first 200

    Build the bundled indexes once into a local 'bucket', then time what a replica does: `searchrl index copy`
    into an empty data dir and `searchrl serve` to the first 200 on the readiness probe; plus a 100k x 768
    Flat stand-in of wiki18-100k (load and first search; no E5 model) and the disk/scan rates docs/deploy.md
    uses for wiki-18. Loopback only, no cloud.
    """
    from searchrl.bench.start_time import format_report, run_start_time
    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging

    setup_logging()
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    bad = [b for b in backends if b not in ("bm25", "dense")]
    if bad or not backends:
        raise ConfigError(f"--backends takes bm25 and/or dense, got {args.backends!r}")
    report = run_start_time(args.work, backends=backends, standin=args.standin)
    print(format_report(report))  # noqa: T201 - results go to stdout
    return 0
