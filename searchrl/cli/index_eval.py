"""`searchrl index eval`: recall@k of FAISS index types against Flat, memory, disk, build and load time.

    searchrl index eval                                   # bundled corpus, the default index types
    searchrl index eval --types "HNSW32;IVF{nlist},SQ8" --k 1,3,10 --queries 1000
    searchrl index eval --synthetic 1000000 --types "Flat;IVF{nlist},SQ8"   # sizing at scale

`searchrl index scale`: IVF-SQ8 at growing N (768 dims), one-core search per nprobe, and the fit to 21M.

    searchrl index scale                                  # 250k, 500k, 1M, 2M vectors; nprobe 32,64,128
    searchrl index scale --sizes 100k,200k --nprobe 16,32 --queries 100

`searchrl index convert-bench`: `searchrl index convert` on a 2M x 768 Flat file, per phase, and its fit to wiki-18.

    searchrl index convert-bench                          # 2M vectors; SQ8, IVF1024,SQ8, IVF{nlist},SQ8
    searchrl index convert-bench --n 200k --types "SQ8;IVF256,SQ8"

`searchrl index build-bench`: the corpus's dense build in fp32 and in bf16, back to back: seconds, and what bf16
changed (cosine per passage, top 3 of held-out queries, recall@3 on the dev set); what precision=auto picks here.

    searchrl index build-bench                            # bundled corpus, bundled MiniLM

Registered under `searchrl index` by `searchrl/cli/index.py` (`register_eval`, `register_scale`,
`register_convert_bench`, `register_build_bench`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from searchrl.cli import given
from searchrl.cli.flags import add_flags, bench_handler, bounded, factory_strings, verb


def register_eval(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "eval", _eval)
    p.add_argument(
        "--types",
        help="';'-separated FAISS factory strings (default 'Flat;SQfp16;HNSW32;IVF{nlist},Flat;IVF{nlist},SQ8;"
        "IVF{nlist},PQ{pq_m}')",
    )
    p.add_argument("--k", help="comma-separated k values for recall@k (default 1,3,10)")
    p.add_argument("--queries", type=int, help="held-out queries (default 1000)")
    p.add_argument(
        "--synthetic", type=int, help="evaluate on N synthetic vectors around the corpus's (sizing)"
    )
    p.add_argument("--train-sample", dest="train_sample", type=int, help="vectors used to train IVF/PQ types")
    p.add_argument("--nprobe", type=int, help="IVF lists probed per query (default 32)")
    p.add_argument("--ef-search", dest="ef_search", type=int, help="HNSW search depth (default 128)")
    add_flags(
        p,
        "out_dir",
        "data_dir",
        "corpus",
        "encoder",
        helps={"corpus": "corpus (default bundled)", "encoder": "encoder (default bundled-minilm)"},
    )


def _eval_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """recall@k of index types vs Flat, with memory, disk, build and load time

    Build each FAISS index type over the dense Flat index's vectors (or N synthetic vectors around them), and
    report recall@k against exact search on held-out queries, size on disk and in memory, build time and load
    time. {nlist} and {pq_m} in a factory string are filled in from N and dim.
    """
    from searchrl.errors import ConfigError

    kwargs = given(args, "out_dir")
    if hasattr(args, "types"):
        kwargs["index_types"] = factory_strings(args.types)
    if hasattr(args, "k"):
        try:
            ks = tuple(int(k) for k in args.k.split(",") if k.strip())
        except ValueError:
            raise ConfigError(
                f"--k: expected comma-separated integers such as 1,3,10, got {args.k!r}"
            ) from None
        if not ks or min(ks) < 1:
            raise ConfigError(f"--k: values must be at least 1, got {args.k!r}")
        kwargs["ks"] = ks
    kwargs.update(
        bounded(
            args,
            ("queries", "n_queries", 1),
            ("synthetic", "synthetic", 0),
            ("train_sample", "train_sample", 1),
            says="must be positive",
        )
    )
    return kwargs


_eval = bench_handler(
    "searchrl.bench.index_eval:run_index_eval",
    "searchrl.bench.index_eval:format_index_eval",
    _eval_kwargs,
    settings=("data_dir", "corpus", "encoder", "nprobe", "ef_search"),
)


def register_scale(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "scale", _scale)
    p.add_argument("--sizes", help="comma-separated vector counts (default 250k,500k,1M,2M)")
    p.add_argument("--nprobe", help="comma-separated nprobe values (default 32,64,128)")
    p.add_argument("--queries", type=int, help="held-out queries (default 200)")
    p.add_argument("--k", type=int, help="recall@k (default 3)")
    p.add_argument("--dim", type=int, help="vector dims (default 768, e5-base-v2's)")
    add_flags(p, "out_dir", "data_dir")


def _scale_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """IVF-SQ8 at growing N (768 dims): build, memory, recall, one-core q/s per nprobe, fit to wiki-18

    Build IVF{nlist},SQ8 over N synthetic 768-dim vectors (around the corpus's real ones, widened by an
    orthonormal map) for each N, measure recall@k against exact search and one-core search time per nprobe,
    fit ms = a + b*bytes scanned + c*centroid bytes, and predict wiki-18 (21M, IVF16384,SQ8). The fit without
    the largest N is checked against it. Method: searchrl/bench/scale.py.
    """
    from searchrl.bench.scale import parse_sizes
    from searchrl.errors import ConfigError

    kwargs = given(args, "out_dir")
    if hasattr(args, "sizes"):
        kwargs["sizes"] = parse_sizes(args.sizes)
    if hasattr(args, "nprobe"):
        try:
            kwargs["nprobes"] = tuple(int(x) for x in args.nprobe.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"--nprobe: expected integers such as 32,64,128, got {args.nprobe!r}") from None
    kwargs.update(bounded(args, ("queries", "n_queries", 1), ("k", "k", 1), ("dim", "dim", 8)))
    return kwargs


_scale = bench_handler("searchrl.bench.scale:run_scale", "searchrl.bench.scale:format_scale", _scale_kwargs)


def register_convert_bench(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "convert-bench", _convert_bench)
    p.add_argument("--n", help="vectors in the Flat file (default 2M)")
    p.add_argument("--types", help="';'-separated factory strings (default 'SQ8;IVF1024,SQ8;IVF{nlist},SQ8')")
    p.add_argument("--base", type=int, help="bundled passages whose vectors seed the clusters (default 2000)")
    p.add_argument("--queries", type=int, help="questions for recall@3 (default 300)")
    p.add_argument("--chunk", type=int, help="rows per chunk (default 262,144, as `index convert`)")
    p.add_argument(
        "--workdir", type=Path, help="where the Flat file and shards go (default outputs/convert-bench)"
    )
    add_flags(p, "out_dir", "data_dir", helps={"data_dir": "where the bundled corpus lives (default ./data)"})


def _convert_bench_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """`index convert` on a synthetic 2M x 768 Flat file: time and peak RSS per phase, recall@3, fit to wiki-18

    Write a synthetic Flat index of N 768-dim vectors to disk (around real bundled MiniLM vectors, as
    `searchrl index scale`), convert it to each --types entry with `searchrl index convert`'s code, and report
    seconds and peak RSS per phase, recall@3 against exact search, index size, and the fitted time and memory
    for wiki-18 (21M, IVF16384,SQ8) on 16 cores, labelled an ESTIMATE with its fit. Method:
    searchrl/bench/convert.py.
    """
    from searchrl.bench.scale import parse_sizes
    from searchrl.errors import ConfigError

    kwargs = given(args, "workdir", "out_dir")
    if hasattr(args, "n"):
        sizes = parse_sizes(args.n)
        if len(sizes) != 1:
            raise ConfigError(f"--n: one count such as 2M, got {args.n!r}")
        kwargs["n"] = sizes[0]
    if hasattr(args, "types"):
        kwargs["types"] = tuple(factory_strings(args.types))
    kwargs.update(
        bounded(args, ("base", "n_base", 10), ("queries", "n_queries", 10), ("chunk", "chunk", 1000))
    )
    return kwargs


_convert_bench = bench_handler(
    "searchrl.bench.convert:run_convert_bench",
    "searchrl.bench.convert:format_convert_bench",
    _convert_bench_kwargs,
)


def register_build_bench(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "build-bench", _build_bench)
    p.add_argument("--queries", type=int, help="held-out queries for the top-3 comparison (default 400)")
    p.add_argument("--workdir", type=Path, help="where the two indexes go (default outputs/build-bench)")
    p.add_argument(
        "--batch-size", dest="encode_batch_size", type=int, help="passages per forward pass (default 64)"
    )
    add_flags(p, "out_dir", "data_dir", "corpus", "encoder")


def _build_bench_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """a dense build in fp32 and in bf16, back to back: seconds, cosine, top 3, recall@3; what auto picks

    Build the corpus's dense Flat index in fp32 and, on a CPU with native BF16, in bf16, one after the other
    under --workdir; report each build's seconds and passages/s, the cosine of every bf16 passage vector to its
    fp32 twin, how many of the held-out queries' top 3 stay the same, recall@3 on the dev QA set, and what
    `precision=auto` picks on this machine. Method: searchrl/bench/build_precision.py.
    """
    return {**given(args, "out_dir", "workdir"), **bounded(args, ("queries", "queries", 1))}


_build_bench = bench_handler(
    "searchrl.bench.build_precision:run_build_bench",
    "searchrl.bench.build_precision:format_build_bench",
    _build_bench_kwargs,
    settings=("data_dir", "corpus", "encoder", "encode_batch_size"),
)
