"""Which corpus a retrieval service searches, and whether Search-R1's training data may be trained against it.

Training on Search-R1's NQ+HotpotQA questions against the bundled 10k-summary corpus teaches the model that
search does not help (most answers are not there), and the run still "succeeds". So `searchrl train local` and
`searchrl sky train` read the service's `GET /` (retrieval/app.py: backend, corpus, corpus_size, corpus_checksum,
index_fingerprint) and refuse any corpus but wiki-18 for the Search-R1 data, unless ALLOW_SMALL_CORPUS=1 (smoke
runs). The launch stores what `GET /` said in the run record, so a run says which corpus and index it saw.

wiki-18 is recognised by size (21,015,324 passages, Search-R1's `wiki-18.jsonl`), so a local copy served from a
path counts too; a web backend has no corpus size and is not wiki-18.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from searchrl.errors import ConfigError, RetrievalUnavailableError

log = logging.getLogger(__name__)

WIKI18_PASSAGES = 21_015_324
ALLOW_ENV = "ALLOW_SMALL_CORPUS"
SEARCH_R1_DATASET = "PeterJinGo/nq_hotpotqa_train"  # Search-R1's NQ+HotpotQA training data (trainer default)
QA_SOURCE_ENV = "SEARCHRL_TRAIN_QA_SOURCE"
_TRUE = {"1", "true", "yes", "on"}  # what pydantic reads as True for the same variable in TrainSettings


@dataclass(frozen=True)
class CorpusIdentity:
    backend: str
    corpus: str | None  # the service's corpus setting: bundled | wiki18-100k | wiki18 | a path
    corpus_size: int | None
    corpus_checksum: str | None
    index_fingerprint: str | None

    @property
    def is_wiki18(self) -> bool:
        return self.corpus_size is not None and self.corpus_size >= WIKI18_PASSAGES

    def describe(self) -> str:
        size = f"{self.corpus_size:,} passages" if self.corpus_size is not None else "no corpus size"
        return f"backend {self.backend}, corpus {self.corpus or '-'} ({size})"

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def corpus_identity(info: dict[str, Any]) -> CorpusIdentity:
    """The corpus fields of a `GET /` answer; a hybrid backend reports its first part that has a corpus."""
    part = info
    for candidate in [info, *(info.get("parts") or [])]:
        if isinstance(candidate, dict) and candidate.get("corpus_size") is not None:
            part = candidate
            break
    size = part.get("corpus_size")
    return CorpusIdentity(
        backend=str(info.get("backend") or "unknown"),
        corpus=part.get("corpus"),
        corpus_size=int(size) if isinstance(size, int | float) else None,
        corpus_checksum=part.get("corpus_checksum"),
        index_fingerprint=part.get("index_fingerprint"),
    )


def fetch_service_info(url: str, api_key: str | None = None, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """`GET <url>/`: the service's description, through `RetrievalClient.info()` (the same TLS trust and token
    as its searches: the system's CAs plus $SEARCHRL_RETRIEVAL_CA_BUNDLE). No secret is logged or echoed."""
    import asyncio

    from searchrl.retrieval.client import RetrievalClient

    async def info() -> dict[str, Any]:
        async with RetrievalClient(url, api_key, timeout_s=timeout_s) as client:
            return await client.info()

    try:
        body = asyncio.run(info())
    except RetrievalUnavailableError as exc:
        raise RetrievalUnavailableError(
            f"GET / on the retrieval service failed ({exc}): cannot tell which corpus it serves",
            kind=exc.kind,
            status=exc.status,
        ) from None
    if body.get("service") != "searchrl-retrieval":
        raise RetrievalUnavailableError(
            "GET / did not describe a searchrl retrieval service (no corpus fields): point RETRIEVAL_SERVICE_URL "
            "at `searchrl serve`",
            kind="bad_response",
        )
    return body


def check_training_corpus(
    identity: CorpusIdentity, *, search_r1_data: bool, allow_small: bool
) -> CorpusIdentity:
    """Raise ConfigError when Search-R1 data would train against a corpus other than wiki-18 (unless allowed)."""
    if not search_r1_data or identity.is_wiki18:
        return identity
    if allow_small:
        log.warning(
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


def check_task_corpus(envs: dict[str, str], url: str, api_key: str | None) -> CorpusIdentity:
    """`searchrl sky train`: the same check from a task's envs, before any GPU is launched."""
    info = fetch_service_info(url, api_key)
    qa_source = envs.get(QA_SOURCE_ENV) or SEARCH_R1_DATASET
    allow = str(envs.get(ALLOW_ENV, "")).strip().lower() in _TRUE
    return check_training_corpus(
        corpus_identity(info), search_r1_data=qa_source == SEARCH_R1_DATASET, allow_small=allow
    )


__all__ = [
    "ALLOW_ENV",
    "SEARCH_R1_DATASET",
    "WIKI18_PASSAGES",
    "CorpusIdentity",
    "check_task_corpus",
    "check_training_corpus",
    "corpus_identity",
    "fetch_service_info",
]
