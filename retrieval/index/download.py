"""Downloads of the public Search-R1 corpora and prebuilt E5 index from the Hugging Face Hub.

    searchrl index download wiki18-100k        # 100k-passage subset + its E5 Flat index (SkyPilot's example)
    searchrl index download wiki18             # full wiki-18 corpus: 21,015,324 passages, ~14 GB unpacked
    searchrl index download wiki18-e5-index    # Search-R1's E5 Flat index over wiki18 (~64.5 GB, 2 parts)

All three are dataset repositories (`repo_type="dataset"`). File names follow the repos as published
(checked against Search-R1's and SkyPilot's download scripts):
    maknee/wiki-18-subsets      wiki-18-100k.jsonl.gz, e5_Flat-100k.index
    PeterJinGo/wiki-18-corpus   wiki-18.jsonl.gz
    PeterJinGo/wiki-18-e5-index part_aa, part_ab  (concatenate in order -> e5_Flat.index)
Corpora are decompressed to `<data_dir>/corpora/` (the document store needs a seekable file); prebuilt
indexes become a normal index directory with a manifest (encoder intfloat/e5-base-v2, mean pooling,
"query: "/"passage: " prefixes: how Search-R1 built them), so the service serves them like its own.
HF_TOKEN / HF_HUB_OFFLINE / HF_ENDPOINT are honoured by huggingface_hub itself.

This module only fetches files; turning a downloaded FAISS file into an index directory is
retrieval/index/prebuilt.py, so imports run one way: prebuilt -> indexing -> download (issue 14 broke the
download <-> indexing cycle).
"""

from __future__ import annotations

import gzip
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from searchrl.errors import ConfigError, CorpusError, first_line

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

REPO_TYPE = "dataset"
E5_ENCODER = "intfloat/e5-base-v2"


@dataclass(frozen=True)
class RemoteCorpus:
    repo_id: str
    filename: str  # a .jsonl.gz in the repo
    local_name: str  # decompressed name under <data_dir>/corpora/
    rows: int  # expected passages (logged if different)


@dataclass(frozen=True)
class RemoteIndex:
    repo_id: str
    parts: tuple[str, ...]  # concatenated in this order
    corpus: str  # the corpus name it indexes
    encoder: str = E5_ENCODER


CORPORA: dict[str, RemoteCorpus] = {
    "wiki18-100k": RemoteCorpus(
        "maknee/wiki-18-subsets", "wiki-18-100k.jsonl.gz", "wiki-18-100k.jsonl", 100_000
    ),
    "wiki18": RemoteCorpus("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "wiki-18.jsonl", 21_015_324),
}
INDEXES: dict[str, RemoteIndex] = {
    "wiki18-100k": RemoteIndex("maknee/wiki-18-subsets", ("e5_Flat-100k.index",), "wiki18-100k"),
    "wiki18-e5-index": RemoteIndex("PeterJinGo/wiki-18-e5-index", ("part_aa", "part_ab"), "wiki18"),
}
DOWNLOADABLE = ("wiki18-100k", "wiki18", "wiki18-e5-index")


def _hub_download(repo_id: str, filename: str, dest_dir: Path) -> Path:
    """One file from a dataset repo into dest_dir (resumable; cached by huggingface_hub)."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError
    except ImportError as exc:  # pragma: no cover - extra missing
        raise ConfigError("downloads need huggingface_hub: pip install -e '.[retrieval]'") from exc
    dest_dir.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s/%s (%s) to %s", repo_id, filename, REPO_TYPE, dest_dir)
    try:
        path = hf_hub_download(repo_id=repo_id, filename=filename, repo_type=REPO_TYPE, local_dir=dest_dir)
    except (HfHubHTTPError, EntryNotFoundError, HFValidationError, OSError) as exc:
        raise CorpusError(
            f"cannot download {filename} from dataset {repo_id} ({first_line(exc)}); check network access "
            "to huggingface.co (or HF_ENDPOINT), or place the file there yourself"
        ) from None
    return Path(path)


def gunzip_once(src: Path, dest: Path) -> Path:
    """Decompress src to dest unless dest already exists (atomic: temp file + rename); returns dest."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with (
            open(src, "rb") as raw,  # its position is the progress: compressed bytes read so far
            gzip.GzipFile(fileobj=raw, mode="rb") as fin,
            open(tmp, "wb") as fout,
            tqdm(
                total=src.stat().st_size,
                unit="B",
                unit_scale=True,
                desc=f"gunzip {src.name}",
                file=sys.stderr,
            ) as bar,
        ):
            last = 0
            while block := fin.read(8 * 1024 * 1024):
                fout.write(block)
                pos = raw.tell()
                bar.update(pos - last)
                last = pos
        os.replace(tmp, dest)
    except (OSError, EOFError) as exc:
        tmp.unlink(missing_ok=True)
        raise CorpusError(f"{src}: cannot decompress ({exc}); delete it and download again") from None
    return dest


def concat_parts(parts: list[Path], dest: Path) -> Path:
    """Concatenate split files (part_aa, part_ab, ...) in order into dest (atomic)."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    total = sum(p.stat().st_size for p in parts)
    with (
        open(tmp, "wb") as fout,
        tqdm(total=total, unit="B", unit_scale=True, desc=f"join {dest.name}", file=sys.stderr) as bar,
    ):
        for part in parts:
            with open(part, "rb") as fin:
                while block := fin.read(16 * 1024 * 1024):
                    fout.write(block)
                    bar.update(len(block))
    os.replace(tmp, dest)
    return dest


def download_corpus(name: str, data_dir: Path) -> Path:
    """Download (once) and decompress a named corpus; returns the plain JSONL path."""
    try:
        remote = CORPORA[name]
    except KeyError:
        raise ConfigError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}") from None
    dest = Path(data_dir) / "corpora" / remote.local_name
    if dest.is_file():
        return dest
    gz = _hub_download(remote.repo_id, remote.filename, Path(data_dir) / "downloads" / name)
    gunzip_once(gz, dest)
    gz.unlink(missing_ok=True)  # the decompressed copy is what we keep
    log.info("corpus %s ready at %s", name, dest)
    return dest


__all__ = [
    "CORPORA",
    "DOWNLOADABLE",
    "INDEXES",
    "concat_parts",
    "download_corpus",
    "gunzip_once",
]
