"""Copy a built index and its corpus between data directories: into the index bucket once, out of it per replica.

    searchrl index copy --from data --to /searchrl-index --backend bm25 --corpus bundled      # publish (index-build.yaml)
    searchrl index copy --from /searchrl-index --to data --backend dense --corpus wiki18 \\
        --encoder intfloat/e5-base-v2                                                         # fetch (retrieval.yaml setup)

Both sides use the data-dir layout of retrieval/index/build.py (`corpora/<file>`, `indexes/<corpus key>/<kind dir>/`),
so a copied directory is exactly what `searchrl serve --data-dir` looks for, and a replica then only loads.

Why copy out of the mount instead of mmap'ing the index on it (docs/deploy.md section 6): a Flat index is read whole
by every query, so every page the kernel drops would be fetched again through FUSE from the object store; on local
disk FAISS and bm25s mmap plain files, and the dense backend can write its encoder-tuning cache next to the index.

Checks, so a replica never serves a wrong or half-copied index: the source manifest must match the configured
corpus (checksum), kind, encoder and, when given, a pinned manifest fingerprint; files are written to a temporary
name and renamed, the manifest last (an index directory without a manifest is not an index); the copy is then
verified again on the destination (checksum, sizes, row count). Files already present with the same size and
modification time are skipped, because setup re-runs on a restarted replica.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from searchrl.errors import ConfigError, IndexLoadError
from searchrl.retrieval.corpus import corpus_checksum
from searchrl.retrieval.index.build import (
    MANIFEST,
    OFFSETS,
    IndexKind,
    IndexManifest,
    corpus_key,
    index_dir_name,
    load_manifest,
    required_files,
    verify_manifest,
)

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

CHUNK = 16 * 1024 * 1024  # bytes per read: large sequential reads are what object-store mounts serve fastest
PUBLISH_HINT = "build and publish it once with sky/index-build.yaml (docs/deploy.md section 6)"


def corpus_relpath(corpus: str) -> Path:
    """Where a named corpus lives inside a data directory (the same place on the bucket and on a replica)."""
    from searchrl.retrieval.index.bundled import BUNDLED_FILENAME
    from searchrl.retrieval.index.download import CORPORA

    name = corpus.strip()
    if name == "bundled":
        return Path("corpora") / BUNDLED_FILENAME
    if name in CORPORA:
        return Path("corpora") / CORPORA[name].local_name
    raise ConfigError(
        f"corpus {name!r}: index copy knows the corpora bundled, {', '.join(CORPORA)}; for your own corpus, put "
        "it under <data_dir>/corpora/ on the bucket and serve it by that path"
    )


@dataclass(frozen=True)
class CopiedIndex:
    """One index copied (or found up to date) at its destination."""

    kind: IndexKind
    index_dir: Path  # the destination index directory
    manifest: IndexManifest
    copied_bytes: int
    skipped_bytes: int  # already present with the same size and modification time
    seconds: float

    def line(self) -> str:
        """What `searchrl index copy` prints per index: directory, fingerprint, summary."""
        return f"{self.index_dir}\t{self.manifest.fingerprint()}\t{self.manifest.summary()}"


def _index_files(index_dir: Path, kind: IndexKind) -> list[Path]:
    """The files an index needs, relative to its directory, manifest last (encoder-tuning caches stay behind)."""
    out: list[Path] = []
    for name in required_files(kind):
        if name == MANIFEST:
            continue
        path = index_dir / name
        if path.is_dir():
            out += sorted(p.relative_to(index_dir) for p in path.rglob("*") if p.is_file())
        else:
            out.append(Path(name))
    return [*out, Path(MANIFEST)]


def _up_to_date(src: Path, dst: Path) -> bool:
    if not dst.is_file():
        return False
    a, b = src.stat(), dst.stat()
    # whole seconds: object stores keep coarser modification times than local disks
    return a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime)


def _copy_file(src: Path, dst: Path, bar: tqdm) -> None:
    """Copy to a temporary name, then rename: a reader never sees a partial file under the real name."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as fout:
            while n := fin.readinto(buf):
                fout.write(view[:n])
                bar.update(n)
        os.replace(tmp, dst)
    except OSError as exc:  # a full disk, a read-only mount, a path in the way: one line, not a traceback
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise IndexLoadError(
            f"cannot copy {src} to {dst}: {exc.strerror or exc}; fix it and run again"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = src.stat()
    try:
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))  # lets a re-run skip it
    except OSError:
        pass  # a mount that keeps no times: the next run copies again, which is correct, only slower


def _locate(settings: RetrievalSettings, kind: IndexKind, root: Path) -> tuple[Path, Path, str]:
    """(corpus file, index dir, corpus checksum) of `kind` for `settings` under the data directory `root`."""
    corpus = root / corpus_relpath(settings.corpus)
    if not corpus.is_file():
        raise IndexLoadError(f"no {settings.corpus} corpus at {corpus}; {PUBLISH_HINT}")
    checksum = corpus_checksum(corpus)
    index_dir = root / "indexes" / corpus_key(corpus, checksum) / index_dir_name(kind, settings)
    return corpus, index_dir, checksum


def copy_index(
    settings: RetrievalSettings,
    kind: IndexKind,
    source: Path,
    dest: Path,
    *,
    fingerprints: Iterable[str] = (),
    progress: bool = True,
) -> CopiedIndex:
    """Copy the `kind` index for `settings` (corpus, encoder, index type) and its corpus from `source` to `dest`.

    `source` and `dest` are data directories. Raises IndexLoadError with one line when the source has no such
    index, it does not match the configuration, its fingerprint is not one of `fingerprints` (when given), or
    the copy does not verify.
    """
    from searchrl.retrieval.encoders.encoder import resolve_encoder

    started = time.perf_counter()
    source, dest = Path(source), Path(dest)
    if not source.is_dir():
        raise IndexLoadError(
            f"index source {source} is not a directory: is the index bucket mounted there? (sky/retrieval.yaml "
            "mounts it when launched with `searchrl sky serve --env SEARCHRL_INDEX_BUCKET=...`)"
        )
    if source.resolve() == dest.resolve():
        raise ConfigError(f"index copy: --from and --to are the same directory ({source})")
    src_corpus, src_index, checksum = _locate(settings, kind, source)
    if not (src_index / MANIFEST).is_file():
        raise IndexLoadError(f"no {kind} index for {settings.corpus} at {src_index}; {PUBLISH_HINT}")
    manifest = load_manifest(src_index)
    spec = resolve_encoder(settings.encoder)[0] if kind == "dense" else None
    verify_manifest(manifest, src_index, kind=kind, checksum=checksum, encoder=spec)
    if kind == "dense" and manifest.index_type != settings.index_type:
        raise IndexLoadError(
            f"index at {src_index} is {manifest.index_type}, the service is configured with {settings.index_type}"
        )
    wanted = {f for f in fingerprints if f}
    if wanted and manifest.fingerprint() not in wanted:
        raise IndexLoadError(
            f"index at {src_index} has fingerprint {manifest.fingerprint()}, not the pinned "
            f"{', '.join(sorted(wanted))} (SEARCHRL_INDEX_FINGERPRINT): the bucket holds another build; "
            "unset the pin or publish the pinned build again"
        )
    rel_index = src_index.relative_to(source)
    pairs = [(src_corpus, dest / src_corpus.relative_to(source))]
    pairs += [(src_index / rel, dest / rel_index / rel) for rel in _index_files(src_index, kind)]
    todo = [(s, d) for s, d in pairs if not _up_to_date(s, d)]
    skipped = sum(s.stat().st_size for s, d in pairs if (s, d) not in todo)
    total = sum(s.stat().st_size for s, _ in todo)
    log.info(
        "copying %s index %s: %d files, %.1f MB (%.1f MB already there) from %s to %s",
        kind,
        manifest.fingerprint(),
        len(todo),
        total / 1e6,
        skipped / 1e6,
        source,
        dest,
    )
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"copy {kind} index",
        file=sys.stderr,
        disable=not progress,
        mininterval=1.0,
    ) as bar:
        for src, dst in todo:
            _copy_file(src, dst, bar)
    _verify_copy(pairs, dest / rel_index, kind, dest / src_corpus.relative_to(source), manifest, spec)
    seconds = time.perf_counter() - started
    log.info("%s index ready at %s in %.1fs (%.1f MB copied)", kind, dest / rel_index, seconds, total / 1e6)
    return CopiedIndex(kind, dest / rel_index, manifest, total, skipped, seconds)


def _verify_copy(
    pairs: list[tuple[Path, Path]],
    index_dir: Path,
    kind: IndexKind,
    corpus: Path,
    manifest: IndexManifest,
    spec: object,
) -> None:
    for src, dst in pairs:
        if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
            raise IndexLoadError(f"copy of {src} to {dst} is incomplete; run the copy again")
    copied = load_manifest(index_dir)
    if copied.fingerprint() != manifest.fingerprint():
        raise IndexLoadError(f"manifest at {index_dir} differs from its source after the copy; run it again")
    verify_manifest(copied, index_dir, kind=kind, corpus_path=corpus, encoder=spec)  # type: ignore[arg-type]
    rows = len(np.load(index_dir / OFFSETS, mmap_mode="r", allow_pickle=False)) - 1
    verify_manifest(copied, index_dir, kind=kind, count=rows)


__all__ = ["CopiedIndex", "copy_index", "corpus_relpath"]
