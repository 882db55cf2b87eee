"""The client room: what calls a running retrieval service, and all the trainer and infer load of retrieval/.

verl's tool (trainer/plugins/tool.py) imports it in every Ray agent-loop worker, eval and the agent loop in every
inference process: nothing here may import faiss, torch, numpy, FastAPI or any other room of retrieval/ (index/,
encoders/, serving/, api/, backends/); only the shared modules at retrieval/'s top (schemas.py), `searchrl`'s
glue, aiohttp and pydantic (tests/retrieval/test_rooms.py imports it in a fresh interpreter to check).

    client.py        RetrievalClient: spread, breakers, hedges, deadlines and retries over the replicas
    transport.py     one HTTP exchange with one replica (aiohttp)
    hits.py          the answer read back as `Hit`s, against the wire format in retrieval/schemas.py
    breaker.py       the per-URL circuit breaker and counters        hedging.py   the hedge budget
    health.py        `check_health`: a real POST /retrieve until a right answer or the deadline
    corpus_check.py  which corpus a service searches (`GET /`), and whether the training data may use it

`from searchrl.retrieval.client import RetrievalClient` is the name callers type; the rest below is what other
areas import from here.
"""

from __future__ import annotations

from searchrl.http import CA_BUNDLE_ENV, tls_context
from searchrl.retrieval.client.breaker import CircuitBreaker
from searchrl.retrieval.client.client import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    CONNECT_TIMEOUT_S,
    MAX_RETRIES,
    POOL_TIMEOUT_S,
    TIMEOUT_S,
    RetrievalClient,
)
from searchrl.retrieval.client.health import HEALTH_QUERY, HealthResult, check_health, summarize_client_stats
from searchrl.retrieval.client.hits import Hit, parse_result

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_MAX_S",
    "CA_BUNDLE_ENV",
    "CONNECT_TIMEOUT_S",
    "MAX_RETRIES",
    "POOL_TIMEOUT_S",
    "TIMEOUT_S",
    "HEALTH_QUERY",
    "CircuitBreaker",
    "HealthResult",
    "Hit",
    "RetrievalClient",
    "check_health",
    "parse_result",
    "summarize_client_stats",
    "tls_context",
]
