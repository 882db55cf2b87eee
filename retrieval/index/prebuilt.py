"""Prebuilt indexes: a downloaded FAISS file (retrieval/index/download.py) installed as a verified index directory.

    searchrl index download wiki18-100k        # corpus + E5 Flat index
    searchrl index download wiki18-e5-index    # Search-R1's E5 Flat index over wiki18 (~64.5 GB, 2 parts)

Separate from retrieval/index/download.py so that imports run one way (prebuilt -> indexing -> download): downloads
know nothing about index directories, and indexing needs downloads only to fetch a named corpus.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from searchrl.errors import ConfigError
from searchrl.retrieval.encoders.encoder import EncoderSpec, resolve_encoder
from searchrl.retrieval.index.build import MANIFEST, import_faiss_index, index_dir_for
from searchrl.retrieval.index.download import (
    CORPORA,
    DOWNLOADABLE,
    INDEXES,
    _hub_download,
    concat_parts,
    download_corpus,
)

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


def download_index(name: str, settings: RetrievalSettings, *, force: bool = False) -> Path:
    """Download a prebuilt E5 index (and its corpus) and install it as a verified index directory.

    The directory is the one the service looks in for `corpus=<its corpus>, encoder=intfloat/e5-base-v2,
    index_type=Flat`, so afterwards `searchrl serve --corpus wiki18-100k --encoder intfloat/e5-base-v2`
    finds it without further flags.
    """
    try:
        remote = INDEXES[name]
    except KeyError:
        raise ConfigError(f"no prebuilt index named {name!r}; choose one of {', '.join(INDEXES)}") from None
    target = settings.with_changes(
        **{"corpus": remote.corpus, "encoder": remote.encoder, "index_type": "Flat"}
    )
    corpus_path = download_corpus(remote.corpus, Path(target.data_dir))
    index_dir = index_dir_for(target, "dense", corpus_path)
    if (index_dir / MANIFEST).is_file() and not force:
        return index_dir
    work = Path(target.data_dir) / "downloads" / name
    parts = [_hub_download(remote.repo_id, part, work) for part in remote.parts]
    faiss_file = parts[0] if len(parts) == 1 else concat_parts(parts, work / "e5_Flat.index")
    spec: EncoderSpec = resolve_encoder(remote.encoder)[0]
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    import_faiss_index(faiss_file, corpus_path, index_dir, spec, index_type="Flat", force=force)
    if len(parts) > 1:
        for part in parts:
            part.unlink(missing_ok=True)
    shutil.rmtree(work / ".cache", ignore_errors=True)
    log.info("prebuilt index %s ready at %s", name, index_dir)
    return index_dir


def download(name: str, settings: RetrievalSettings, *, force: bool = False) -> Path:
    """What `searchrl index download NAME` runs: a corpus name gives its JSONL, an index name its directory."""
    if name in INDEXES:
        return download_index(name, settings, force=force)
    if name in CORPORA:
        return download_corpus(name, Path(settings.data_dir))
    raise ConfigError(f"unknown download {name!r}; choose one of {', '.join(DOWNLOADABLE)}")


__all__ = ["download", "download_index"]
