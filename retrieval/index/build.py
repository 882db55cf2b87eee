"""Index directories: build (dense FAISS or BM25), describe (manifest.json), find, and verify.

Build one with `searchrl index build --backend dense|bm25|all` (or let the service build it on first use).

Layout, under `<data_dir>/indexes/<corpus stem>-<corpus checksum[:10]>/`:
    dense-<encoder>-<index type>/   manifest.json  index.faiss  offsets.npy
    bm25/                           manifest.json  bm25/ (bm25s files)  offsets.npy
`offsets.npy` is the document store's row -> byte offset table for the corpus the index was built from.
The manifest (IndexManifest) records encoder, pooling, prefixes, dim, count, corpus path and checksum, FAISS
factory string, metric, build time and versions, so a service refuses an index that does not match the
corpus or encoder it was configured with, in one line, instead of serving wrong passages.

Builds write into a temporary sibling directory and rename it into place when complete, so an interrupted
build never leaves a directory that looks usable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from tqdm import tqdm

from searchrl import __version__
from searchrl.errors import ConfigError, CorpusError, IndexLoadError
from searchrl.retrieval.corpus import corpus_checksum, count_rows, iter_rows_with_offsets, save_offsets

if TYPE_CHECKING:
    from searchrl.retrieval.encoders.encoder import Encoder, EncoderSpec
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

IndexKind = Literal["dense", "bm25"]
KINDS: tuple[IndexKind, ...] = ("dense", "bm25")
MANIFEST = "manifest.json"
OFFSETS = "offsets.npy"
FAISS_FILE = "index.faiss"
BM25_DIR = "bm25"
FORMAT_VERSION = 1

# BM25 tokenisation: what the index was built with must be what queries use (checked via the manifest).
BM25_STEMMER = "english"
BM25_STOPWORDS = "en"
# Corpora whose dense index is fetched prebuilt rather than built here (E5 over 100k/21M passages on CPU
# takes hours/weeks); `searchrl index download` gets them.
NAMED_CORPORA = ("wiki18-100k", "wiki18")
# Vectors used to train index types that need it (IVF, PQ, ...): the corpus head, up to this many.
TRAIN_SAMPLE = 262_144
ENCODE_CHUNK = 4096  # passages read, length-sorted and encoded together


class IndexManifest(BaseModel):
    """manifest.json of an index directory."""

    model_config = ConfigDict(extra="ignore")

    format_version: int = FORMAT_VERSION
    kind: IndexKind
    count: int  # passages indexed = rows in the corpus
    corpus_path: str  # where the corpus was at build time (informational; the checksum is what is checked)
    corpus_checksum: str
    # dense only
    # EncoderSpec.to_dict(): name, pooling, prefixes, dim, normalize; and, for builds since issue 47, the
    # precision the passages were encoded in (a key of this dict, so older manifests keep their fingerprint)
    encoder: dict[str, Any] | None = None
    dim: int | None = None
    index_type: str | None = None  # FAISS factory string (Flat, HNSW32, IVF4096,SQ8, ...)
    metric: str | None = None  # inner_product (normalised vectors: cosine)
    # bm25 only
    tokenizer: dict[str, Any] | None = None  # stemmer, stopwords
    bm25: dict[str, Any] | None = None  # k1, b, method
    # provenance
    build_seconds: float = 0.0
    created_at: str = ""
    searchrl_version: str = __version__
    source: str = "built"  # built | prebuilt (a downloaded FAISS file) | converted (from a Flat index)
    # converted only (retrieval/index/convert.py): recall@3 against the Flat index it came from, and that index
    recall: dict[str, Any] | None = None
    converted_from: dict[str, Any] | None = None

    def fingerprint(self) -> str:
        """A short hash of the whole manifest: identifies one build of one index (recorded by evaluations)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One line for `searchrl index build` output and logs."""
        if self.kind == "dense":
            enc = self.encoder or {}
            precision = f" ({enc['precision']})" if enc.get("precision") else ""
            what = f"encoder={enc.get('name')}{precision} dim={self.dim} index={self.index_type}"
        else:
            what = f"stemmer={(self.tokenizer or {}).get('stemmer')} stopwords={(self.tokenizer or {}).get('stopwords')}"
        return f"{self.kind}: {self.count} passages, {what}, built in {self.build_seconds:.1f}s"


# --- locating corpora and index directories -----------------------------------------------------------------


def resolve_corpus(settings: RetrievalSettings) -> Path:
    """A plain (seekable) Search-R1 JSONL for `settings.corpus`, converting or downloading it if needed.

    bundled -> `<data_dir>/corpora/wiki-bundled-en.jsonl`; wiki18-100k | wiki18 -> downloaded and
    decompressed under `<data_dir>/corpora/`; a `.jsonl.gz` path -> decompressed copy there; a path -> itself.
    """
    name = settings.corpus.strip()
    data_dir = Path(settings.data_dir)
    if name == "bundled":
        from searchrl.retrieval.index.bundled import ensure_bundled_corpus

        return ensure_bundled_corpus(data_dir)
    if name in NAMED_CORPORA:
        from searchrl.retrieval.index.download import download_corpus

        return download_corpus(name, data_dir)
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"corpus {name!r} is not a file; set SEARCHRL_RETRIEVAL_CORPUS (or --corpus) to bundled, "
            f"{', '.join(NAMED_CORPORA)}, or a Search-R1 JSONL(.gz) path"
        )
    if path.suffix == ".gz":
        from searchrl.retrieval.index.download import gunzip_once

        return gunzip_once(path, data_dir / "corpora" / path.with_suffix("").name)
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def corpus_key(corpus_path: Path, checksum: str | None = None) -> str:
    """Directory name for a corpus's indexes: its stem plus a checksum prefix (edits get a fresh dir).

    Pass `checksum` when the caller already has it (over a bucket mount every read is a network round trip).
    """
    stem = corpus_path.name.removesuffix(".jsonl")
    digest = (checksum or corpus_checksum(corpus_path)).split(":", 1)[1]
    return f"{_slug(stem)}-{digest[:10]}"


def index_dir_name(kind: IndexKind, settings: RetrievalSettings) -> str:
    if kind == "bm25":
        return "bm25"
    encoder = settings.encoder.rstrip("/").rsplit("/", 1)[-1]
    return f"dense-{_slug(encoder)}-{_slug(settings.index_type)}"


def default_index_dir(settings: RetrievalSettings, kind: IndexKind, corpus_path: Path | None = None) -> Path:
    """Where the index for (corpus, kind, encoder, index type) lives unless `settings.index_dir` says otherwise."""
    corpus_path = corpus_path or resolve_corpus(settings)
    return Path(settings.data_dir) / "indexes" / corpus_key(corpus_path) / index_dir_name(kind, settings)


def index_dir_for(settings: RetrievalSettings, kind: IndexKind, corpus_path: Path | None = None) -> Path:
    return Path(settings.index_dir) if settings.index_dir else default_index_dir(settings, kind, corpus_path)


# --- manifest ---------------------------------------------------------------------------------------------


def load_manifest(index_dir: Path | str) -> IndexManifest:
    index_dir = Path(index_dir)
    path = index_dir / MANIFEST
    if not path.is_file():
        raise IndexLoadError(
            f"no index at {index_dir} ({MANIFEST} missing); build it with `searchrl index build`"
        )
    try:
        return IndexManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise IndexLoadError(
            f"{path} is unreadable or not an index manifest ({first}); rebuild with --force"
        ) from None


def write_manifest(manifest: IndexManifest, index_dir: Path) -> None:
    (index_dir / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")


def required_files(kind: IndexKind) -> tuple[str, ...]:
    return (MANIFEST, OFFSETS, FAISS_FILE) if kind == "dense" else (MANIFEST, OFFSETS, BM25_DIR)


def verify_manifest(
    manifest: IndexManifest,
    index_dir: Path | str,
    *,
    kind: IndexKind,
    corpus_path: Path | None = None,
    checksum: str | None = None,
    encoder: EncoderSpec | None = None,
    count: int | None = None,
) -> None:
    """Raise IndexLoadError with one line naming the first mismatch between an index and what serves it.

    `encoder` with `dim=None` skips the dim check (the model is not loaded yet); `count` is the row count
    of the loaded index (FAISS ntotal, doc store length) when known.
    """
    index_dir = Path(index_dir)
    fix = f"rebuild with `searchrl index build --force` or point index_dir elsewhere (index: {index_dir})"
    if manifest.kind != kind:
        raise IndexLoadError(
            f"index at {index_dir} is a {manifest.kind} index, but backend {kind} needs a {kind} one"
        )
    missing = [name for name in required_files(kind) if not (index_dir / name).exists()]
    if missing:
        raise IndexLoadError(f"index at {index_dir} is incomplete (missing {', '.join(missing)}); {fix}")
    if corpus_path is not None or checksum is not None:
        actual = checksum or corpus_checksum(corpus_path)  # type: ignore[arg-type]
        if actual != manifest.corpus_checksum:
            raise IndexLoadError(
                f"corpus checksum differs: index at {index_dir} was built from {manifest.corpus_path} "
                f"({manifest.corpus_checksum[:23]}...), but the configured corpus {corpus_path} is "
                f"{actual[:23]}...; {fix}"
            )
    if count is not None and count != manifest.count:
        raise IndexLoadError(
            f"count differs: manifest says {manifest.count} passages, index holds {count}; {fix}"
        )
    if kind == "dense" and encoder is not None:
        built = manifest.encoder or {}
        for field in ("name", "pooling", "query_prefix", "passage_prefix"):
            if built.get(field) != getattr(encoder, field):
                raise IndexLoadError(
                    f"encoder differs: index at {index_dir} was built with {field}={built.get(field)!r}, "
                    f"the service is configured with {field}={getattr(encoder, field)!r}; set "
                    f"SEARCHRL_RETRIEVAL_ENCODER={built.get('name')} or {fix}"
                )
        if encoder.dim is not None and manifest.dim != encoder.dim:
            raise IndexLoadError(
                f"dim differs: index at {index_dir} has dim {manifest.dim}, encoder {encoder.name} gives {encoder.dim}"
            )
    if kind == "bm25":
        tok = manifest.tokenizer or {}
        if tok.get("stemmer") != BM25_STEMMER or tok.get("stopwords") != BM25_STOPWORDS:
            raise IndexLoadError(
                f"bm25 tokenizer differs: index at {index_dir} used {tok}, this version uses "
                f"stemmer={BM25_STEMMER} stopwords={BM25_STOPWORDS}; {fix}"
            )


# --- building ---------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _staging_dir(index_dir: Path) -> Path:
    # Unique per build (pid + random): two builds of the same index, even in one process, never share one.
    staging = index_dir.with_name(f".{index_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    return staging


def _commit(staging: Path, index_dir: Path, *, force: bool) -> None:
    """Move a finished build into place; an existing index is replaced only with force."""
    if index_dir.exists():
        if not force:
            # Another process finished first (two servers started at once): keep theirs.
            shutil.rmtree(staging, ignore_errors=True)
            return
        old = index_dir.with_name(f".{index_dir.name}.old-{os.getpid()}")
        os.replace(index_dir, old)
        os.replace(staging, index_dir)
        shutil.rmtree(old, ignore_errors=True)
        return
    os.replace(staging, index_dir)


@contextlib.contextmanager
def _staged(index_dir: Path, *, force: bool) -> Iterator[Path]:
    """Yield a staging directory next to `index_dir`; move it into place on success, delete it on failure.

    A crash or Ctrl-C mid-build never leaves a half-written index where the service would load it.
    """
    staging = _staging_dir(index_dir)
    try:
        yield staging
        _commit(staging, index_dir, force=force)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _progress(total: int | None, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="doc", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)


def build_bm25_index(corpus_path: Path, index_dir: Path, *, force: bool = False) -> IndexManifest:
    """Tokenise (lowercase, English stopwords, Snowball English stemmer) and index every passage with bm25s."""
    import bm25s
    import Stemmer

    started = time.perf_counter()
    checksum = corpus_checksum(corpus_path)
    with _staged(index_dir, force=force) as staging:
        offsets: list[int] = []
        texts: list[str] = []
        end = 0
        with _progress(count_rows(corpus_path), "bm25: reading corpus") as bar:
            for start, stop, passage in iter_rows_with_offsets(corpus_path):
                offsets.append(start)
                end = stop
                texts.append(passage.contents)
                bar.update(1)
        offsets.append(end)
        if not texts:
            raise CorpusError(f"{corpus_path}: corpus is empty")
        stemmer = Stemmer.Stemmer(BM25_STEMMER)
        tokens = bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, stemmer=stemmer, show_progress=True)
        del texts
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=True)
        retriever.save(str(staging / BM25_DIR), show_progress=False)
        save_offsets(offsets, staging / OFFSETS)
        manifest = IndexManifest(
            kind="bm25",
            count=len(offsets) - 1,
            corpus_path=str(Path(corpus_path).resolve()),
            corpus_checksum=checksum,
            tokenizer={"stemmer": BM25_STEMMER, "stopwords": BM25_STOPWORDS, "lower": True},
            bm25={"k1": retriever.k1, "b": retriever.b, "method": retriever.method},
            build_seconds=round(time.perf_counter() - started, 2),
            created_at=_now(),
        )
        write_manifest(manifest, staging)
    log.info("built bm25 index %s: %s", index_dir, manifest.summary())
    return manifest


def new_faiss_index(dim: int, index_type: str) -> Any:
    """An empty FAISS index from a factory string, inner-product metric (vectors are normalised)."""
    import faiss

    try:
        return faiss.index_factory(dim, index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else "invalid"
        raise ConfigError(
            f"index_type {index_type!r} is not a valid FAISS factory string ({first})"
        ) from None


def min_training_points(index_type: str) -> int:
    """Vectors FAISS needs to train `index_type`: k-means wants at least as many points as centroids, so
    IVF<n> needs n and PQ<m>x<b> needs 2^b (b = 8 by default); Flat, HNSW and SQ need none (0)."""
    need = 0
    for nlist in re.findall(r"IVF(\d+)", index_type):
        need = max(need, int(nlist))
    for nbits in re.findall(r"PQ\d+(?:x(\d+))?", index_type):
        need = max(need, 2 ** int(nbits or 8))
    return need


def check_trainable(index_type: str, passages: int, train_sample: int = TRAIN_SAMPLE) -> None:
    """ConfigError in one line, before any encoding, when the corpus is too small to train `index_type`."""
    need = min_training_points(index_type)
    have = min(passages, train_sample)
    if need > have:
        raise ConfigError(
            f"index_type {index_type!r} needs at least {need} passages to train, this corpus has {passages}"
            + (f" (train_sample {train_sample})" if train_sample < passages else "")
            + "; use Flat or HNSW32 for a corpus this small"
        )


def build_dense_index(
    corpus_path: Path,
    index_dir: Path,
    encoder: Encoder,
    *,
    index_type: str = "Flat",
    batch_size: int = 128,
    force: bool = False,
    train_sample: int = TRAIN_SAMPLE,
) -> IndexManifest:
    """Encode every passage with `encoder` and add it to a FAISS index built from `index_type`.

    Streams the corpus in chunks of ENCODE_CHUNK passages, so memory holds one chunk of text plus the
    index. Index types that need training (IVF, PQ) train on the first `train_sample` vectors
    (settings.train_sample).
    """
    import faiss

    started = time.perf_counter()
    total = count_rows(corpus_path)
    check_trainable(
        index_type, total, train_sample
    )  # before minutes of encoding, not a FAISS traceback after
    checksum = corpus_checksum(corpus_path)
    index = new_faiss_index(encoder.dim, index_type)
    with _staged(index_dir, force=force) as staging:
        offsets: list[int] = []
        pending: list[np.ndarray] = []  # vectors waiting for training (untrained index types only)
        pending_n = 0
        end = 0
        chunk: list[str] = []

        def flush(bar: tqdm) -> None:
            nonlocal pending_n
            vecs = encoder.encode_passages(chunk, batch_size=batch_size, progress=bar)
            chunk.clear()
            if index.is_trained:
                index.add(vecs)
                return
            pending.append(vecs)
            pending_n += len(vecs)
            if pending_n >= train_sample:
                _train_and_add(index, pending)
                pending.clear()

        with _progress(total, f"dense: encoding with {encoder.spec.name}") as bar:
            for start, stop, passage in iter_rows_with_offsets(corpus_path):
                offsets.append(start)
                end = stop
                chunk.append(passage.contents)
                if len(chunk) >= ENCODE_CHUNK:
                    flush(bar)
            if chunk:
                flush(bar)
        if pending:
            _train_and_add(index, pending)
        offsets.append(end)
        count = len(offsets) - 1
        if count == 0:
            raise CorpusError(f"{corpus_path}: corpus is empty")
        if index.ntotal != count:
            raise IndexLoadError(f"built index holds {index.ntotal} vectors for {count} passages")
        faiss.write_index(index, str(staging / FAISS_FILE))
        save_offsets(offsets, staging / OFFSETS)
        manifest = IndexManifest(
            kind="dense",
            count=count,
            corpus_path=str(Path(corpus_path).resolve()),
            corpus_checksum=checksum,
            encoder={**encoder.spec.to_dict(), "precision": encoder.precision},
            dim=encoder.dim,
            index_type=index_type,
            metric="inner_product",
            build_seconds=round(time.perf_counter() - started, 2),
            created_at=_now(),
        )
        write_manifest(manifest, staging)
    log.info("built dense index %s: %s", index_dir, manifest.summary())
    return manifest


def _train_and_add(index: Any, parts: list[np.ndarray]) -> None:
    sample = np.concatenate(parts)
    log.info("training FAISS index on %d vectors", len(sample))
    index.train(sample)
    index.add(sample)


def import_faiss_index(
    faiss_file: Path,
    corpus_path: Path,
    index_dir: Path,
    encoder: EncoderSpec,
    *,
    index_type: str = "Flat",
    force: bool = False,
) -> IndexManifest:
    """Make an index directory around a prebuilt FAISS file (e.g. Search-R1's E5 Flat index over wiki-18).

    The file is moved (not copied: it is 64 GB for wiki-18) into the directory; offsets are built by scanning
    the corpus, and the manifest records the encoder the file was built with, which the caller must know.
    """
    import faiss

    started = time.perf_counter()
    index = faiss.read_index(str(faiss_file), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    dim, ntotal = int(index.d), int(index.ntotal)
    del index
    checksum = corpus_checksum(corpus_path)
    with _staged(index_dir, force=force) as staging:
        from searchrl.retrieval.corpus import build_offsets

        count = build_offsets(corpus_path, staging / OFFSETS)
        if count != ntotal:
            raise IndexLoadError(
                f"count differs: {faiss_file} holds {ntotal} vectors but {corpus_path} has {count} passages"
            )
        spec = encoder if encoder.dim is not None else type(encoder)(**{**encoder.to_dict(), "dim": dim})
        if spec.dim != dim:
            raise IndexLoadError(
                f"dim differs: {faiss_file} has dim {dim}, encoder {spec.name} gives {spec.dim}"
            )
        os.replace(faiss_file, staging / FAISS_FILE)
        manifest = IndexManifest(
            kind="dense",
            count=count,
            corpus_path=str(Path(corpus_path).resolve()),
            corpus_checksum=checksum,
            encoder=spec.to_dict(),
            dim=dim,
            index_type=index_type,
            metric="inner_product",
            build_seconds=round(time.perf_counter() - started, 2),
            created_at=_now(),
            source="prebuilt",
        )
        write_manifest(manifest, staging)
    return manifest


# --- the one entry point the service and CLI use -----------------------------------------------------------


def ensure_index(
    settings: RetrievalSettings,
    kind: IndexKind,
    *,
    force: bool = False,
    encoder_factory: Callable[[], Encoder] | None = None,
) -> Path:
    """Return a verified index directory for (settings, kind), building it first when missing (or forced).

    Builds only when `settings.build_if_missing` (or `force`); a dense index for wiki18/wiki18-100k is never
    built implicitly (hours to weeks on CPU): `searchrl index download` fetches the prebuilt E5 one.
    `encoder_factory` lets a caller that already loaded the encoder reuse it for the build.
    """
    from searchrl.retrieval.encoders.encoder import Encoder, resolve_encoder

    corpus_path = resolve_corpus(settings)
    index_dir = index_dir_for(settings, kind, corpus_path)
    checksum = corpus_checksum(corpus_path)
    spec = resolve_encoder(settings.encoder)[0] if kind == "dense" else None
    if (index_dir / MANIFEST).is_file() and not force:
        verify_manifest(
            load_manifest(index_dir),
            index_dir,
            kind=kind,
            corpus_path=corpus_path,
            checksum=checksum,
            encoder=spec,
        )
        log.info("reusing %s index at %s", kind, index_dir)
        return index_dir
    if not (force or settings.build_if_missing):
        raise IndexLoadError(
            f"no {kind} index at {index_dir} and build_if_missing is off; build it with "
            f"`searchrl index build --backend {kind}`"
        )
    if kind == "dense" and settings.corpus.strip() in NAMED_CORPORA and not force:
        raise IndexLoadError(
            f"no dense index for {settings.corpus} at {index_dir}; fetch the prebuilt E5 index with "
            f"`searchrl index download {settings.corpus}` (and encoder intfloat/e5-base-v2), or build one "
            "explicitly with `searchrl index build --backend dense` (hours on CPU)"
        )
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    log.info("building %s index for %s at %s", kind, corpus_path, index_dir)
    if kind == "bm25":
        build_bm25_index(corpus_path, index_dir, force=force)
    else:
        if min_training_points(settings.index_type):  # fail before loading the encoder, not after encoding
            check_trainable(settings.index_type, count_rows(corpus_path), settings.train_sample)
        encoder = (
            encoder_factory()
            if encoder_factory
            else Encoder.from_settings(settings, batch_size=settings.encode_batch_size)
        )
        if settings.precision == "auto":  # measured on this CPU (retrieval/encoders/precision.py)
            from searchrl.retrieval.encoders.precision import choose_build_encoder

            encoder, why = choose_build_encoder(
                encoder, corpus_path, count_rows(corpus_path), batch_size=settings.encode_batch_size
            )
            log.info("dense index build encodes passages in %s", why)
        build_dense_index(
            corpus_path,
            index_dir,
            encoder,
            index_type=settings.index_type,
            batch_size=settings.encode_batch_size,
            force=force,
            train_sample=settings.train_sample,
        )
    return index_dir


def describe(index_dir: Path) -> dict[str, Any]:
    """The manifest as a dict plus the directory (what `searchrl index build` prints as JSON)."""
    data = json.loads((index_dir / MANIFEST).read_text(encoding="utf-8"))
    return {"index_dir": str(index_dir), **data}


__all__ = [
    "IndexManifest",
    "build_bm25_index",
    "build_dense_index",
    "corpus_key",
    "default_index_dir",
    "ensure_index",
    "import_faiss_index",
    "index_dir_for",
    "index_dir_name",
    "load_manifest",
    "resolve_corpus",
    "verify_manifest",
]
