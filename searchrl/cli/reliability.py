"""`searchrl reliability`: the reliability benchmark (what `make bench-reliability` runs; issue 13).

    searchrl reliability                              # every scenario, 600 s soak (~20 minutes in all)
    searchrl reliability --seconds 60 --only soak,kill,hang --out outputs/bench

Starts real `searchrl serve` replicas on loopback ports, runs the scenarios in `searchrl.bench.reliability`
(soak, 10x overload, SIGKILL/SIGSTOP of a replica behind the verl tool, SIGSTOP of 1 of 2 replicas mid-run with
the client's defaults (issue 26: p50/p99/max and hedges), SIGTERM drain, 200 MB body, 400 slow connections,
8 hostile pages in flight in page mode (issue 26: /health p99, RSS growth, page failures by reason)) and prints
a markdown table on stdout; JSON rows go to `--out`/reliability.json. Exit code 1 when a row that carries its own
bounds (`hostile`) broke one; the rows that broke them are logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from searchrl.cli.flags import add_flags, retrieval_settings, verb

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "reliability", _run)
    p.add_argument("--seconds", type=float, help="soak length; other scenarios use up to 30 s (default 600)")
    p.add_argument(
        "--only",
        help="comma-separated: soak,overload,kill,hang,freeze,drain,big-body,slow,hostile (default all)",
    )
    add_flags(
        p,
        "corpus",
        "data_dir",
        "out_dir",
        helps={
            "corpus": "corpus to serve (default bundled)",
            "out_dir": "directory for reliability.json (default outputs/bench)",
        },
    )
    p.add_argument(
        "--no-tool",
        dest="tool",
        action="store_false",
        help="drive kill/hang with RetrievalClient instead of the verl SearchTool (no verl needed)",
    )


def tool_caller(urls: list[str]) -> tuple[Any, Any, Any]:
    """call(query) through the verl SearchTool (what rollouts run), its client's stats, and close."""
    from searchrl.trainer.plugins.tool import SearchTool

    # verl's BaseTool prints the tool schema on stdout; stdout carries only the results table here
    with contextlib.redirect_stdout(sys.stderr):
        tool = SearchTool({"type": "native", "retrieval_urls": urls, "timeout_s": 2.0, "max_retries": 3})

    async def call(query: str) -> str:
        instance_id, _ = await tool.create(create_kwargs={"question": query})
        response, _, _ = await tool.execute(instance_id, {"query": query})
        await tool.release(instance_id)
        return str(response.text)

    return call, lambda: tool._get_client().stats(), tool.aclose


def _run(args: argparse.Namespace) -> int:
    """reliability benchmark: soak, overload, dying/hung replicas, drain, big bodies, slow clients, hostile pages

    Run the issue-13 fault scenarios against real service processes on loopback.
    """
    from searchrl.bench.reliability import SCENARIOS, render_table, run_all
    from searchrl.errors import ConfigError
    from searchrl.logs import setup_logging

    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # else one INFO line per /health probe and page call
    only = [s.strip() for s in getattr(args, "only", ",".join(SCENARIOS)).split(",") if s.strip()]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown:
        raise ConfigError(
            f"--only: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    settings = retrieval_settings(args, "corpus", "data_dir", backend="bm25")
    out_dir: Path = getattr(args, "out_dir", Path("outputs/bench"))
    seconds = float(getattr(args, "seconds", 600.0))
    make_call = tool_caller if getattr(args, "tool", True) else None
    with tempfile.TemporaryDirectory(prefix="searchrl-reliability-") as tmp:
        rows = asyncio.run(run_all(settings, Path(tmp), seconds=seconds, only=only, make_call=make_call))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "reliability.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(render_table(rows))  # noqa: T201
    log.info("wrote %s", out_dir / "reliability.json")
    broken = [row for row in rows if row.get("passed") is False]
    for row in broken:
        log.error("%s: bounds broken: %s", row["scenario"], "; ".join(row["failed"]))
    return 1 if broken else 0
