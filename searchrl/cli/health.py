"""`searchrl health URL`: POST a real /retrieve query until a correct answer or the deadline.

    searchrl health http://127.0.0.1:8000
    searchrl health "$RETRIEVAL_SERVICE_URL" --deadline 300          # comma-separated URLs: each must pass
    searchrl health http://IP:PORT --api-key-env MY_TOKEN --expect "Seventh Seal"

Exit 0 only when every URL answers the query with well-formed passages (and, with --expect, one of them
contains the text); otherwise one line saying why and exit 2 (401, malformed response, wrong shape, no
passages: a refusal) or 75 (unreachable, timed out, 5xx/429 until the deadline: an outage, e.g. SkyServe's load
balancer answering 503 while a replica is replaced; trainer/node/refusal.py never counts it as a refusal). The token is read from the environment variable named by --api-key-env
(RETRIEVAL_API_KEY by default), never from argv. Used by sky/train.yaml to fail fast before GPUs spin.
"""

from __future__ import annotations

import argparse
import os

from searchrl.cli.flags import verb
from searchrl.urls import split_urls


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = verb(sub, "health", _health)
    p.add_argument(
        "urls", nargs="+", metavar="URL", help="service base URL(s); commas separate a failover list"
    )
    p.add_argument("--deadline", type=float, help="seconds to keep trying per URL (default 30)")
    p.add_argument(
        "--api-key-env", dest="api_key_env", help="env var holding the token (default RETRIEVAL_API_KEY)"
    )
    p.add_argument("--query", help="the question to send (default: Who directed The Seventh Seal?)")
    p.add_argument("--topk", type=int, help="passages to ask for (default 3)")
    p.add_argument("--expect", help="pass only if a returned passage contains this text (case-insensitive)")


def _health(args: argparse.Namespace) -> int:
    """check a retrieval service answers a real /retrieve query

    POST a real query with retries until a correct answer or the deadline; exit 0 only then.
    """
    from searchrl.errors import ConfigError, RetrievalUnavailableError, ServiceUnavailableError
    from searchrl.retrieval.client import HEALTH_QUERY, check_health

    key_env = getattr(args, "api_key_env", "RETRIEVAL_API_KEY")
    if not key_env.replace("_", "").isalnum():
        raise ConfigError(
            f"--api-key-env takes an environment variable NAME, not a value ({len(key_env)} chars)"
        )
    api_key = os.environ.get(key_env) or None
    deadline = getattr(args, "deadline", 30.0)
    if deadline <= 0:
        raise ConfigError(f"--deadline must be positive, got {deadline}")
    expect = getattr(args, "expect", None)
    urls = split_urls(args.urls)
    if not urls:
        raise ConfigError("no URL given: searchrl health http://HOST:PORT")
    for url in urls:
        result = check_health(
            url,
            api_key,
            deadline_s=deadline,
            query=getattr(args, "query", HEALTH_QUERY),
            topk=getattr(args, "topk", 3),
        )
        reason = " ".join(result.reason.split())  # one line, whatever the server sent
        if not result.ok:
            unavailable = ServiceUnavailableError if result.outage else RetrievalUnavailableError
            raise unavailable(f"{url}: {reason}", kind="health")
        if expect and not any(expect.lower() in hit.contents.lower() for hit in result.hits):
            titles = ", ".join(repr(h.title) for h in result.hits) or "none"
            raise RetrievalUnavailableError(
                f"{url}: wrong answer: no passage contains {expect!r} (got {titles})", kind="health"
            )
        print(f"{url}: {reason}")  # noqa: T201  (stdout carries results)
    return 0
