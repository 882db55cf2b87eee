"""Whether a retrieval service may serve a training run, decided from its `GET /` (standard library only).

    python3 -m searchrl.corpus_gate      # on a node, from the synced workdir, before anything is installed

Two ways a service burns a training run although it answers:
- **A corpus other than wiki-18** for Search-R1's questions: most answers are not there, so the policy learns that
  search does not help, and the run still "succeeds". Refused unless ALLOW_SMALL_CORPUS=1 (smoke runs).
- **A Flat index over ~1M+ passages on CPU**: exact search scans every vector per query (~200 ms a query on 2
  cores at wiki-18's 21M x 768, docs/sizing.md), ~40 q/s per 16-core replica. Step 1's 2,560 first searches
  (512 prompts x 5 samples) then wait ~32 s on two replicas against the tool's 10 s timeout, the failure guard
  (5% of searches failed, trainer/plugins/reward.py) stops the run, and the restarts repeat it. IVF16384,SQ8 (the
  documented wiki-18 build) answers the same searches in ~6 s. Refused unless ALLOW_FLAT_INDEX=1. A Flat index
  searched on a GPU (the encoder's device is cuda: the service moves the index there, fp16) is fast and allowed.

`searchrl sky train` applies `check_service` to the service's `GET /` before launching (retrieval/client/corpus_check.py),
and the first check of sky/train.yaml's setup runs this module, so a by-hand `sky jobs launch` refuses the same
services before the lock install (exit 2 through trainer/node/refusal.py: a refusal, never restarted twice). A service
this module cannot reach is left to the run's health step (it waits for a replica to start): it says so and
exits 0.

Standard library only (plus searchrl/errors.py and searchrl/urls.py, themselves standard library only): the node runs it with the
system python from the synced workdir before anything is installed.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from searchrl.errors import ConfigError
from searchrl.urls import scheme_problem, split_urls

log = logging.getLogger(__name__)

WIKI18_PASSAGES = 21_015_324
ALLOW_ENV = "ALLOW_SMALL_CORPUS"
ALLOW_FLAT_ENV = "ALLOW_FLAT_INDEX"
# A Flat index from this many passages on is refused on CPU. Flat's cost grows with N: docs/sizing.md's ~200 ms a
# query on 2 cores at 21M x 768 gives ~40 x 21M/N q/s per 16-core replica (index alone, an ESTIMATE), so two
# replicas miss step 1's 2,560 searches in 10 s from ~6.6M passages, sooner with the encoder on the same cores.
# 1M errs early on purpose (the line; no CPU Flat corpus between 1M and 21M is documented): a replica
# measured with `make bench-service` can be let through with ALLOW_FLAT_INDEX=1.
FLAT_MAX_PASSAGES = 1_000_000
SEARCH_R1_DATASET = "PeterJinGo/nq_hotpotqa_train"  # Search-R1's NQ+HotpotQA training data (trainer default)
QA_SOURCE_ENV = "SEARCHRL_TRAIN_QA_SOURCE"
_CA_BUNDLE_ENV = (
    "SEARCHRL_RETRIEVAL_CA_BUNDLE"  # = searchrl/http.py CA_BUNDLE_ENV (that module needs tenacity)
)
_TRUE = {"1", "true", "yes", "on"}  # what pydantic reads as True for the same variable in TrainSettings


@dataclass(frozen=True)
class CorpusIdentity:
    backend: str
    corpus: str | None  # the service's corpus setting: bundled | wiki18-100k | wiki18 | a path
    corpus_size: int | None
    corpus_checksum: str | None
    index_fingerprint: str | None
    index_type: str | None = None  # FAISS factory string (Flat, IVF16384,SQ8, ...), bm25s, or None (web)
    device: str | None = None  # the dense encoder's device; a cuda encoder searches the index on the GPU

    @property
    def is_wiki18(self) -> bool:
        return self.corpus_size is not None and self.corpus_size >= WIKI18_PASSAGES

    @property
    def is_large_flat_on_cpu(self) -> bool:
        return (
            (self.index_type or "").strip().lower() == "flat"
            and (self.corpus_size or 0) >= FLAT_MAX_PASSAGES
            and not (self.device or "").startswith("cuda")
        )

    def describe(self) -> str:
        size = f"{self.corpus_size:,} passages" if self.corpus_size is not None else "no corpus size"
        return f"backend {self.backend}, corpus {self.corpus or '-'} ({size})"

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def corpus_identity(info: Mapping[str, Any]) -> CorpusIdentity:
    """The corpus fields of a `GET /` answer; a hybrid backend reports its first part that has a corpus."""
    part: Mapping[str, Any] = info
    for candidate in [info, *(info.get("parts") or [])]:
        if isinstance(candidate, Mapping) and candidate.get("corpus_size") is not None:
            part = candidate
            break
    size = part.get("corpus_size")
    index_type = part.get("index_type")
    device = part.get("device")
    return CorpusIdentity(
        backend=str(info.get("backend") or "unknown"),
        corpus=part.get("corpus"),
        corpus_size=int(size) if isinstance(size, (int, float)) else None,
        corpus_checksum=part.get("corpus_checksum"),
        index_fingerprint=part.get("index_fingerprint"),
        index_type=str(index_type) if index_type else None,
        device=str(device) if device else None,
    )


def check_training_corpus(
    identity: CorpusIdentity, *, search_r1_data: bool, allow_small: bool
) -> CorpusIdentity:
    """Raise ConfigError when Search-R1 data would train against a corpus other than wiki-18 (unless allowed)."""
    if not search_r1_data or identity.is_wiki18:
        return identity
    if allow_small:
        log.warning(  # unconfigured on a node: Python's last-resort handler prints it to stderr
            "training Search-R1 data against %s, not wiki-18 (%s=1): fine for a smoke run, not for results",
            identity.describe(),
            ALLOW_ENV,
        )
        return identity
    raise ConfigError(
        f"the retrieval service searches {identity.describe()}, not wiki-18 ({WIKI18_PASSAGES:,} passages): "
        "Search-R1's questions mostly have no answer there, so the policy learns that search does not help. "
        f"Serve wiki-18 (SEARCHRL_RETRIEVAL_CORPUS=wiki18) or set {ALLOW_ENV}=1 for a smoke run"
    )


def check_index_speed(identity: CorpusIdentity, *, allow_flat: bool) -> CorpusIdentity:
    """Raise ConfigError for a Flat index over FLAT_MAX_PASSAGES+ passages searched on CPU (unless allowed)."""
    if not identity.is_large_flat_on_cpu or allow_flat:
        return identity
    raise ConfigError(
        f"the retrieval service searches {identity.describe()} with a {identity.index_type} index on CPU: ~40 queries/s per 16-core replica "
        "(docs/sizing.md), so step 1's 2,560 searches outlast the tool's 10 s timeout and the 5% failure guard "
        "stops the run. Serve the IVF16384,SQ8 build (SEARCHRL_RETRIEVAL_INDEX_TYPE=IVF16384,SQ8, "
        f"sky/index-build.yaml) or a GPU replica, or set {ALLOW_FLAT_ENV}=1"
    )


def check_service(info: Mapping[str, Any], envs: Mapping[str, str]) -> CorpusIdentity:
    """Both checks on a `GET /` answer, with the run's settings taken from its envs (task envs or os.environ)."""
    identity = corpus_identity(info)
    qa_source = envs.get(QA_SOURCE_ENV) or SEARCH_R1_DATASET
    check_training_corpus(
        identity,
        search_r1_data=qa_source == SEARCH_R1_DATASET,
        allow_small=_true(envs.get(ALLOW_ENV)),
    )
    return check_index_speed(identity, allow_flat=_true(envs.get(ALLOW_FLAT_ENV)))


def _true(value: str | None) -> bool:
    return str(value or "").strip().lower() in _TRUE


def fetch_info(url: str, api_key: str | None, *, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """`GET <url>/` with the run's token and CA bundle; None when it cannot be read as a searchrl service."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context()
        bundle = os.environ.get(_CA_BUNDLE_ENV, "").strip()
        if bundle:
            context.load_verify_locations(cafile=os.path.expanduser(bundle))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(url.rstrip("/") + "/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:  # noqa: S310
            body = json.loads(response.read())
    except (OSError, ValueError):  # URLError, HTTPError, timeouts, TLS and JSON errors: not readable here
        return None
    return body if isinstance(body, dict) and body.get("service") == "searchrl-retrieval" else None


def main() -> int:
    """The node-side gate: 0 (allowed, or not readable: the health step waits), 2 with one line (refused)."""
    urls = split_urls(os.environ.get("RETRIEVAL_SERVICE_URL", ""))
    api_key = os.environ.get("RETRIEVAL_API_KEY") or None
    for url in urls:
        if scheme_problem(url):
            continue  # not a service this gate can read; the settings refuse it with the same line
        info = fetch_info(url, api_key)
        if info is None:
            continue
        try:
            identity = check_service(info, os.environ)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)  # noqa: T201  (searchrl's one-line refusal, exit 2)
            return 2
        print(f"retrieval corpus: {identity.describe()}")  # noqa: T201
        return 0
    print(  # noqa: T201
        "corpus check deferred: no retrieval URL answered GET / yet; the run's health step waits for the service "
        "and `searchrl train local` checks its corpus"
    )
    return 0


__all__ = [
    "ALLOW_ENV",
    "ALLOW_FLAT_ENV",
    "FLAT_MAX_PASSAGES",
    "QA_SOURCE_ENV",
    "SEARCH_R1_DATASET",
    "WIKI18_PASSAGES",
    "CorpusIdentity",
    "check_index_speed",
    "check_service",
    "check_training_corpus",
    "corpus_identity",
    "fetch_info",
    "main",
]


if __name__ == "__main__":
    sys.exit(main())
