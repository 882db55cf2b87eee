"""`searchrl bench`: the retrieval service load benchmark (what `make bench` runs).

    searchrl bench                       # bundled corpus, MiniLM, Flat; ~3 minutes on 2 cores
    searchrl bench --seconds 5 --out outputs/bench

Prints the table and ratios on stdout; JSON results go to `--out` (default outputs/bench/).
"""

from __future__ import annotations

import argparse

from searchrl.cli import given
from searchrl.cli.flags import add_flags, bench_handler, verb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "bench", _bench)
    p.add_argument("--seconds", type=float, help="seconds per service scenario (default 8)")
    p.add_argument(
        "--ceiling-seconds", dest="ceiling_seconds", type=float, help="seconds per ceiling point (default 3)"
    )
    add_flags(p, "out_dir")
    p.add_argument(
        "--precisions",
        help="comma-separated torch precisions for the in-process ceiling (default fp32: today's path)",
    )
    p.add_argument(
        "--batch-sizes", dest="batch_sizes", help="comma-separated ceiling batch sizes (default 32,64,128)"
    )
    p.add_argument(
        "--forward-sizes",
        dest="forward_sizes",
        help="comma-separated encoder forward-pass sizes (default 16,32)",
    )
    p.add_argument("--threads", help="comma-separated model thread counts for the ceiling (default 1,2)")
    p.add_argument(
        "--server-threads",
        dest="server_threads",
        type=int,
        help="model threads of the benchmarked service (default: auto-tuned at its start-up)",
    )
    p.add_argument(
        "--e5-seconds",
        dest="e5_seconds",
        type=float,
        help="seconds per E5-base-shaped encoder measurement for the sizing table (default 2; 0 skips)",
    )
    add_flags(
        p,
        "data_dir",
        "corpus",
        "encoder",
        "index_type",
        helps={
            "corpus": "corpus to benchmark (default bundled)",
            "encoder": "encoder (default bundled-minilm)",
        },
    )


def _csv(value: str, cast: type) -> tuple:  # type: ignore[type-arg]
    from searchrl.errors import ConfigError

    try:
        items = tuple(cast(v.strip()) for v in value.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"expected a comma-separated list, got {value!r}") from None
    if not items:
        raise ConfigError(f"expected a comma-separated list, got {value!r}")
    return items


def _bench_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """benchmark the retrieval service (in-process ceiling vs HTTP under load)

    Measure the dense backend's in-process ceiling (today's torch fp32, several batch sizes), then a real
    `searchrl serve` subprocess (which auto-tunes its encoder at start-up) at 1/32/128 one-query clients, 4
    clients x 32 queries, and 32 clients with 5x repeated queries, beside a reference-like server (one encode +
    search per request, no batcher) at 1 and 128 clients, the service's RSS (anonymous vs file-backed), the
    encoder worker scaling, and replicas/$ per 1M queries. Unique queries; loopback only; bounded in time.
    """
    from searchrl.errors import ConfigError

    kwargs = given(args, "seconds", "ceiling_seconds", "out_dir", "e5_seconds", "server_threads")
    if hasattr(args, "precisions"):
        precisions = _csv(args.precisions, str)
        bad = [p for p in precisions if p not in {"fp32", "bf16", "fp16"}]  # torch precisions
        if bad:
            raise ConfigError(f"--precisions: unknown {', '.join(bad)}; use fp32, bf16 (CPU) or fp16 (GPU)")
        kwargs["precisions"] = precisions
    for name in ("batch_sizes", "forward_sizes", "threads"):
        if hasattr(args, name):
            kwargs[name] = _csv(getattr(args, name), int)
    return kwargs


_bench = bench_handler(
    "searchrl.bench.service:run_bench",
    "searchrl.bench.service_report:format_report",
    _bench_kwargs,
    settings=("data_dir", "corpus", "encoder", "index_type"),
)
