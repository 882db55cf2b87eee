"""The `searchrl` command: one parser, one module per area (serve, index, train, sky, health, eval, bench).

Each area module has `register(subparsers)` which adds its subcommands and sets `handler` on the parsed
namespace. A handler builds settings from the flags the user actually gave (defaults are argparse.SUPPRESS so
pydantic-settings keeps env > .env > default precedence), calls one library function and prints the result.

Errors: a `SearchRLError` becomes `error: <message>` on stderr and exit code 2; SEARCHRL_DEBUG=1 adds the
traceback. Anything else propagates, because it is a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from searchrl import __version__
from searchrl.errors import SearchRLError
from searchrl.processes import terminated_by, unwinding_on_sigterm

# Area modules, in help order. A module that fails to import (missing extra) still lets the others work.
AREAS = ["serve", "index", "health", "train", "sky", "eval", "model", "bench", "reliability", "smoke"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="searchrl",
        description="Train and deploy search agents with RL (Search-R1 recipe on verl + SkyPilot).",
    )
    parser.add_argument("--version", action="version", version=f"searchrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for area in AREAS:
        try:
            module = importlib.import_module(f"searchrl.cli.{area}")
        except ModuleNotFoundError as exc:
            if exc.name == f"searchrl.cli.{area}":
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def given(args: argparse.Namespace, *names: str) -> dict[str, object]:
    """The subset of `names` the user set on the command line (flags default to argparse.SUPPRESS)."""
    return {n: getattr(args, n) for n in names if hasattr(args, n)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    # `train` verbs start verl, Ray, services and vLLM engines: on SIGTERM they unwind like Ctrl-C and stop them
    # (searchrl/processes.py). `serve` keeps uvicorn's own SIGTERM drain and exit status.
    unwind = unwinding_on_sigterm() if args.command == "train" else contextlib.nullcontext()
    try:
        with unwind:
            rc = handler(args)
    except SearchRLError as exc:
        if os.environ.get("SEARCHRL_DEBUG") == "1":
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return exc.exit_code
    except KeyboardInterrupt:
        stopped = terminated_by()
        if stopped is None:
            return 130
        print(f"error: stopped by {stopped.name}; what the run started was stopped", file=sys.stderr)  # noqa: T201
        return 128 + stopped
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
