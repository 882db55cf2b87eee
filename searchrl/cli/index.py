"""`searchrl index`: build or download retrieval indexes.

    searchrl index build                                  # the configured backend over the bundled corpus
    searchrl index build --backend all                    # dense (bundled MiniLM) and BM25
    searchrl index build --backend dense --corpus my.jsonl --encoder intfloat/e5-base-v2 --force
    searchrl index download wiki18-100k                   # 100k passages + prebuilt E5 Flat index
    searchrl index copy --from data --to /searchrl-index  # publish a built index to the bucket mount (or back)

Prints each index directory and a one-line manifest summary on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import logging

from searchrl.cli import given
from searchrl.errors import ConfigError

log = logging.getLogger(__name__)

DOWNLOADS = ("wiki18-100k", "wiki18", "wiki18-e5-index")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "index", help="build or download retrieval indexes", description=__doc__.splitlines()[0]
    )
    verbs = p.add_subparsers(dest="index_verb", metavar="VERB")
    p.set_defaults(handler=lambda _args: _usage(p))

    b = verbs.add_parser(
        "build",
        help="build a dense (FAISS) and/or BM25 index over a corpus",
        description="Build a self-describing index directory (manifest.json) over a Search-R1 JSONL corpus; "
        "an existing matching index is reused unless --force.",
        argument_default=argparse.SUPPRESS,
    )
    b.add_argument(
        "--backend",
        choices=["dense", "bm25", "all", "hybrid", "google", "google-cse", "serper", "serpapi", "searxng"],
        help="which index: dense, bm25, all; a serving backend name builds what it serves from "
        "(hybrid = both, web backends = none). Default: the configured backend",
    )
    b.add_argument("--corpus", help="bundled | wiki18-100k | wiki18 | path to Search-R1 JSONL(.gz)")
    b.add_argument("--encoder", help="bundled-minilm | intfloat/e5-base-v2 | BAAI/bge-base-en-v1.5 | folder")
    b.add_argument("--index-type", dest="index_type", help="FAISS factory string (default Flat)")
    b.add_argument("--data-dir", dest="data_dir", help="where corpora and indexes live (default ./data)")
    b.add_argument("--index-dir", dest="index_dir", help="explicit output directory (one backend only)")
    b.add_argument(
        "--batch-size", dest="encode_batch_size", type=int, help="passages per forward pass (default 128)"
    )
    b.add_argument("--device", help="auto | cpu | cuda")
    b.add_argument("--precision", help="auto | fp32 | bf16 | fp16 (fp16 on GPU only)")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching index exists")
    b.set_defaults(handler=_build)

    d = verbs.add_parser(
        "download",
        help="download a public corpus or prebuilt index from the Hugging Face Hub",
        description="wiki18-100k: 100k-passage wiki-18 subset + its E5 Flat index (maknee/wiki-18-subsets); "
        "wiki18: the full 21M-passage corpus (PeterJinGo/wiki-18-corpus); wiki18-e5-index: Search-R1's "
        "E5 Flat index over it (PeterJinGo/wiki-18-e5-index, ~64.5 GB).",
        argument_default=argparse.SUPPRESS,
    )
    d.add_argument("name", choices=DOWNLOADS, help="what to download")
    d.add_argument("--data-dir", dest="data_dir", help="where corpora and indexes live (default ./data)")
    d.add_argument("--force", action="store_true", help="re-import the index even if present")
    d.set_defaults(handler=_download)

    c = verbs.add_parser(
        "copy",
        help="copy a built index and its corpus between data directories (to or from the index bucket)",
        description="Copy the index the settings name (backend, corpus, encoder, index type) and its corpus from "
        "one data directory to another: into the bucket mount once (sky/index-build.yaml), out of it on every "
        "replica (sky/retrieval.yaml setup). Verifies corpus checksum, encoder, row count and, with "
        "--fingerprint, the exact build; files already there are skipped. No download, no build.",
        argument_default=argparse.SUPPRESS,
    )
    c.add_argument("--from", dest="source", required=True, help="data directory to copy from")
    c.add_argument("--to", dest="dest", required=True, help="data directory to copy into")
    c.add_argument(
        "--backend",
        choices=["dense", "bm25", "all", "hybrid", "google", "google-cse", "serper", "serpapi", "searxng"],
        help="which index (as for build; web backends copy nothing). Default: the configured backend",
    )
    c.add_argument("--corpus", help="bundled | wiki18-100k | wiki18")
    c.add_argument("--encoder", help="encoder of a dense index (default bundled-minilm)")
    c.add_argument("--index-type", dest="index_type", help="FAISS factory string (default Flat)")
    c.add_argument(
        "--fingerprint",
        help="comma-separated manifest fingerprints the copied indexes must have (pins one build); "
        "empty = any",
    )
    c.set_defaults(handler=_copy)

    # benchmarks live in their own modules: index types (eval) and retrieval quality on a QA set (recall)
    from searchrl.cli.index_eval import register_eval, register_scale
    from searchrl.cli.index_recall import register_recall

    register_eval(verbs)
    register_scale(verbs)
    register_recall(verbs)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _settings(args: argparse.Namespace, *names: str):  # -> RetrievalSettings
    from searchrl.config import load_settings
    from searchrl.retrieval.settings import RetrievalSettings

    return load_settings(RetrievalSettings, **given(args, *names))


def _kinds(choice: str) -> list[str]:
    """Index kinds a backend choice serves from: hybrid and all need both, web backends none."""
    if choice in ("all", "hybrid"):
        return ["dense", "bm25"]
    if choice in ("dense", "bm25"):
        return [choice]
    return []


def _build(args: argparse.Namespace) -> int:
    from searchrl.logs import setup_logging
    from searchrl.retrieval.indexing import ensure_index, load_manifest

    setup_logging()
    settings = _settings(
        args,
        "corpus",
        "encoder",
        "index_type",
        "data_dir",
        "index_dir",
        "encode_batch_size",
        "device",
        "precision",
    )
    choice = getattr(args, "backend", settings.backend)
    kinds = _kinds(choice)
    if not kinds:  # web backends: nothing local to build (lets deploy scripts call this for any backend)
        log.info("backend %s searches the web: no local index to build", choice)
        return 0
    if settings.index_dir is not None and len(kinds) > 1:
        raise ConfigError("--index-dir names one directory: use it with --backend dense or --backend bm25")
    for kind in kinds:
        index_dir = ensure_index(settings, kind, force=getattr(args, "force", False))  # type: ignore[arg-type]
        print(f"{index_dir}\t{load_manifest(index_dir).summary()}")  # noqa: T201 - CLI result
    return 0


def _download(args: argparse.Namespace) -> int:
    from searchrl.logs import setup_logging
    from searchrl.retrieval.prebuilt import download

    setup_logging()
    settings = _settings(args, "data_dir")
    path = download(args.name, settings, force=getattr(args, "force", False))
    print(path)  # noqa: T201 - CLI result
    return 0


def _copy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from searchrl.logs import setup_logging
    from searchrl.retrieval.index_copy import copy_index

    setup_logging()
    settings = _settings(args, "corpus", "encoder", "index_type")
    choice = getattr(args, "backend", settings.backend)
    kinds = _kinds(choice)
    if not kinds:
        log.info("backend %s searches the web: no index to copy", choice)
        return 0
    pins = [f.strip() for f in getattr(args, "fingerprint", "").split(",") if f.strip()]
    for kind in kinds:
        done = copy_index(settings, kind, Path(args.source), Path(args.dest), fingerprints=pins)  # type: ignore[arg-type]
        print(done.line())  # noqa: T201 - CLI result
    return 0
