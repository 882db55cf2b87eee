"""`searchrl index`: build or download retrieval indexes.

    searchrl index build                                  # the configured backend over the bundled corpus
    searchrl index build --backend all                    # dense (bundled MiniLM) and BM25
    searchrl index build --backend dense --corpus my.jsonl --encoder intfloat/e5-base-v2 --force
    searchrl index download wiki18-100k                   # 100k passages + prebuilt E5 Flat index
    searchrl index copy --from data --to /searchrl-index  # publish a built index to the bucket mount (or back)
    searchrl index convert --corpus wiki18 --encoder intfloat/e5-base-v2   # Flat -> IVF16384,SQ8 on CPU

Prints each index directory and a one-line manifest summary on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import logging

from searchrl.cli.flags import add_flags, group, retrieval_settings, verb
from searchrl.errors import ConfigError

log = logging.getLogger(__name__)

DOWNLOADS = ("wiki18-100k", "wiki18", "wiki18-e5-index")
# the flags that say which index `build` and `convert` write, and where
_WHERE = ("corpus", "encoder", "index_type", "data_dir", "index_dir")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """build or download retrieval indexes

    `searchrl index`: build or download retrieval indexes.
    """
    verbs = group(sub, "index", register, dest="index_verb", usage_on_stdout=True)

    b = verb(verbs, "build", _build)
    b.add_argument(
        "--backend",
        choices=["dense", "bm25", "all", "hybrid", "google", "google-cse", "serper", "serpapi", "searxng"],
        help="which index: dense, bm25, all; a serving backend name builds what it serves from "
        "(hybrid = both, web backends = none). Default: the configured backend",
    )
    add_flags(b, "corpus", "encoder", "index_type", "data_dir")
    b.add_argument("--index-dir", dest="index_dir", help="explicit output directory (one backend only)")
    b.add_argument(
        "--batch-size", dest="encode_batch_size", type=int, help="passages per forward pass (default 64)"
    )
    b.add_argument("--device", help="auto | cpu | cuda")
    b.add_argument(
        "--precision",
        help="auto | fp32 | bf16 | fp16 (fp16 on GPU only); auto on CPU: bf16 where the CPU has native BF16 "
        "and it measures faster on the corpus's first passages, else fp32 (the choice is logged)",
    )
    b.add_argument("--force", action="store_true", help="rebuild even if a matching index exists")

    d = verb(verbs, "download", _download)
    d.add_argument("name", choices=DOWNLOADS, help="what to download")
    add_flags(d, "data_dir")
    d.add_argument("--force", action="store_true", help="re-import the index even if present")

    c = verb(verbs, "copy", _copy)
    c.add_argument("--from", dest="source", required=True, help="data directory to copy from")
    c.add_argument("--to", dest="dest", required=True, help="data directory to copy into")
    c.add_argument(
        "--backend",
        choices=["dense", "bm25", "all", "hybrid", "google", "google-cse", "serper", "serpapi", "searxng"],
        help="which index (as for build; web backends copy nothing). Default: the configured backend",
    )
    add_flags(
        c,
        "corpus",
        "encoder",
        "index_type",
        helps={
            "corpus": "bundled | wiki18-100k | wiki18",
            "encoder": "encoder of a dense index (default bundled-minilm)",
        },
    )
    c.add_argument(
        "--fingerprint",
        help="comma-separated manifest fingerprints the copied indexes must have (pins one build); "
        "empty = any",
    )

    v = verb(verbs, "convert", _convert)
    v.add_argument(
        "--from",
        dest="from_path",
        metavar="PATH",
        help="a Flat index folder (with manifest.json) or a bare FAISS Flat file such as Search-R1's e5_Flat.index "
        "(then --corpus names its corpus). Default: the Flat index of --corpus/--encoder under --data-dir",
    )
    add_flags(
        v,
        "corpus",
        "encoder",
        helps={"encoder": "the Flat index's encoder, e.g. intfloat/e5-base-v2 (default bundled-minilm)"},
    )
    v.add_argument(
        "--index-type",
        dest="index_type",
        metavar="TYPE",
        help="FAISS factory string to convert to: IVF<n>,SQ8 | IVF<n>,Flat | IVF<n>,PQ<m> | SQ8 | SQfp16 | PQ<m> "
        "(default IVF16384,SQ8, the wiki-18 training index; SEARCHRL_RETRIEVAL_INDEX_TYPE when not Flat)",
    )
    add_flags(v, "data_dir")
    v.add_argument(
        "--index-dir",
        dest="index_dir",
        metavar="DIR",
        help="explicit output directory (default: the service's)",
    )
    v.add_argument(
        "--train-sample",
        dest="convert_train_sample",
        metavar="N",
        type=int,
        help="vectors to train on, a seeded uniform sample (default 0 = 64 per IVF list, at least 65,536)",
    )
    v.add_argument(
        "--chunk",
        dest="convert_chunk",
        metavar="N",
        type=int,
        help="rows read, added and checkpointed together (262,144)",
    )
    v.add_argument(
        "--min-recall",
        dest="convert_min_recall",
        metavar="R",
        type=float,
        help="recall@3 vs Flat to install (default 0.90)",
    )
    v.add_argument(
        "--nprobe",
        type=int,
        metavar="N",
        help="IVF lists probed when measuring recall (the service's, default 32)",
    )
    v.add_argument(
        "--queries",
        dest="convert_queries",
        metavar="N",
        type=int,
        help="questions for the recall check (500)",
    )
    v.add_argument(
        "--questions",
        metavar="PATH",
        help="JSONL or parquet with a `question` field to measure recall on (default: Search-R1's NQ+HotpotQA "
        "train questions for wiki18*, else the dev questions plus corpus-derived ones)",
    )
    v.add_argument(
        "--memory-gb",
        dest="convert_memory_gb",
        metavar="GB",
        type=float,
        help="memory the run may use (default 0 = MemAvailable, or the cgroup limit when lower)",
    )
    v.add_argument(
        "--threads", type=int, metavar="N", help="FAISS threads (default 0 = every core this process may use)"
    )
    v.add_argument("--plan", action="store_true", help="print the plan (memory, disk, chunks) and stop")
    v.add_argument("--force", action="store_true", help="convert again even if the target index exists")

    # benchmarks live in their own modules: index types (eval) and retrieval quality on a QA set (recall)
    from searchrl.cli.index_eval import (
        register_build_bench,
        register_convert_bench,
        register_eval,
        register_scale,
    )
    from searchrl.cli.index_recall import register_recall

    register_eval(verbs)
    register_scale(verbs)
    register_convert_bench(verbs)
    register_recall(verbs)
    register_build_bench(verbs)


def _kinds(choice: str) -> list[str]:
    """Index kinds a backend choice serves from: hybrid and all need both, web backends none."""
    if choice in ("all", "hybrid"):
        return ["dense", "bm25"]
    if choice in ("dense", "bm25"):
        return [choice]
    return []


def _build(args: argparse.Namespace) -> int:
    """build a dense (FAISS) and/or BM25 index over a corpus

    Build a self-describing index directory (manifest.json) over a Search-R1 JSONL corpus; an existing
    matching index is reused unless --force.
    """
    from searchrl.logs import setup_logging
    from searchrl.retrieval.index.build import ensure_index, load_manifest

    setup_logging()
    settings = retrieval_settings(args, *_WHERE, "encode_batch_size", "device", "precision")
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
    """download a public corpus or prebuilt index from the Hugging Face Hub

    wiki18-100k: 100k-passage wiki-18 subset + its E5 Flat index (maknee/wiki-18-subsets); wiki18: the full
    21M-passage corpus (PeterJinGo/wiki-18-corpus); wiki18-e5-index: Search-R1's E5 Flat index over it
    (PeterJinGo/wiki-18-e5-index, ~64.5 GB).
    """
    from searchrl.logs import setup_logging
    from searchrl.retrieval.index.prebuilt import download

    setup_logging()
    settings = retrieval_settings(args, "data_dir")
    path = download(args.name, settings, force=getattr(args, "force", False))
    print(path)  # noqa: T201 - CLI result
    return 0


def _copy(args: argparse.Namespace) -> int:
    """copy a built index and its corpus between data directories (to or from the index bucket)

    Copy the index the settings name (backend, corpus, encoder, index type) and its corpus from one data
    directory to another: into the bucket mount once (sky/index-build.yaml), out of it on every replica
    (sky/retrieval.yaml setup). Verifies corpus checksum, encoder, row count and, with --fingerprint, the
    exact build; files already there are skipped. No download, no build.
    """
    from pathlib import Path

    from searchrl.logs import setup_logging
    from searchrl.retrieval.index.copy import copy_index

    setup_logging()
    settings = retrieval_settings(args, "corpus", "encoder", "index_type")
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


def _convert(args: argparse.Namespace) -> int:
    """turn a Flat index into IVF16384,SQ8 (or another FAISS type) on CPU, from its own vectors

    Train a compressed index on a sample of a Flat index's vectors and fill it from them in chunks (no encoder
    pass over the corpus, no GPU), measure recall@3 against the Flat index on real questions encoded with its
    encoder, and install it as the index directory the service loads for --index-type (manifest with
    `recall`). Memory and disk needed are printed first; a node with less is refused (exit 2). A killed run
    resumes where it stopped when run again with the same flags (work in `.<index dir>.convert/` next to it),
    giving the same index. Recall below --min-recall exits 2 and installs nothing; the Flat index is only
    read. Arithmetic: docs/sizing.md, section Converting; costs: docs/deploy.md section 3.
    """
    from pathlib import Path

    from searchrl.logs import setup_logging
    from searchrl.retrieval.index.convert import DEFAULT_TARGET, convert_index

    setup_logging()
    settings = retrieval_settings(
        args,
        *_WHERE,
        "convert_train_sample",
        "convert_chunk",
        "convert_min_recall",
        "convert_queries",
        "convert_memory_gb",
        "nprobe",
        "threads",
    )
    # the service's default Flat is never a conversion target: without a flag or env, the training index
    target = settings.index_type if settings.index_type.replace(" ", "") != "Flat" else DEFAULT_TARGET
    questions = Path(args.questions) if hasattr(args, "questions") else None
    if questions is not None and not questions.is_file():
        raise ConfigError(f"--questions {questions}: no such file")
    index_dir, manifest, plan = convert_index(
        settings,
        from_path=Path(args.from_path) if hasattr(args, "from_path") else None,
        index_type=target,
        questions=questions,
        force=getattr(args, "force", False),
        plan_only=getattr(args, "plan", False),
    )
    if manifest is None:
        print("\n".join(plan.lines()))  # noqa: T201 - CLI result
        return 0
    recall = manifest.recall or {}
    print(f"{index_dir}\t{manifest.summary()}")  # noqa: T201 - CLI result
    if recall:
        k = recall.get("k")
        print(  # noqa: T201 - CLI result
            f"recall@{k} {recall.get(f'recall@{k}')} at nprobe {recall.get('nprobe')} on {recall.get('queries')} "
            f"questions ({recall.get('query_source')})"
        )
    return 0
