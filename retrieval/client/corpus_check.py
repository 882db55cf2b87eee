"""Which corpus a retrieval service searches, and whether Search-R1's training data may be trained against it.

Training on Search-R1's NQ+HotpotQA questions against the bundled 10k-summary corpus teaches the model that
search does not help (most answers are not there), and the run still "succeeds". So `searchrl train local` and
`searchrl sky train` read the service's `GET /` (retrieval/serving/app.py: backend, corpus, corpus_size,
corpus_checksum, index_fingerprint, index_type) and refuse any corpus but wiki-18 for the Search-R1 data, unless ALLOW_SMALL_CORPUS=1
(smoke runs), and a Flat index over 1M+ passages on CPU, unless ALLOW_FLAT_INDEX=1 (searchrl/corpus_gate.py
says why). The launch stores what `GET /` said in the run record, so a run says which corpus and index it saw.

wiki-18 is recognised by size (21,015,324 passages, Search-R1's `wiki-18.jsonl`), so a local copy served from a
path counts too; a web backend has no corpus size and is not wiki-18.
"""

from __future__ import annotations

import logging
from typing import Any

# The decision is standard library only, so a node can run it before anything is installed (sky/train.yaml's
# setup); this module adds the RetrievalClient fetch the plan and `searchrl train local` use.
from searchrl.corpus_gate import (
    ALLOW_ENV,
    ALLOW_FLAT_ENV,
    FLAT_MAX_PASSAGES,
    QA_SOURCE_ENV,
    SEARCH_R1_DATASET,
    WIKI18_PASSAGES,
    CorpusIdentity,
    check_index_speed,
    check_service,
    check_training_corpus,
    corpus_identity,
)
from searchrl.errors import RetrievalUnavailableError

log = logging.getLogger(__name__)


def fetch_service_info(url: str, api_key: str | None = None, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """`GET <url>/`: the service's description, through `RetrievalClient.info()` (the same TLS trust and token
    as its searches: the system's CAs plus $SEARCHRL_RETRIEVAL_CA_BUNDLE). No secret is logged or echoed."""
    import asyncio

    from searchrl.retrieval.client.client import RetrievalClient

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


def check_task_corpus(envs: dict[str, str], url: str, api_key: str | None) -> CorpusIdentity:
    """`searchrl sky train`: the corpus and index-speed checks from a task's envs, before any GPU is launched."""
    return check_service(fetch_service_info(url, api_key), envs)


__all__ = [
    "ALLOW_ENV",
    "ALLOW_FLAT_ENV",
    "FLAT_MAX_PASSAGES",
    "SEARCH_R1_DATASET",
    "QA_SOURCE_ENV",
    "WIKI18_PASSAGES",
    "CorpusIdentity",
    "check_index_speed",
    "check_service",
    "check_task_corpus",
    "check_training_corpus",
    "corpus_identity",
    "fetch_service_info",
]
