"""RetrievalSettings: every knob of the retrieval service, from flags > env > .env > defaults.

Env names are SEARCHRL_RETRIEVAL_<FIELD>, except the ones users know from the Search-R1/SkyPilot recipes
(RETRIEVAL_API_KEY, GOOGLE_API_KEY, ...), which are declared as aliases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BackendName = Literal["dense", "bm25", "hybrid", "google", "serper", "searxng"]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class RetrievalSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SEARCHRL_RETRIEVAL_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
    )

    # --- what to serve -------------------------------------------------------------------------------------
    backend: BackendName = "bm25"  # bm25 | dense (FAISS) | hybrid | google | serper | searxng
    data_dir: Path = Path("data")  # corpora and index directories live under here
    corpus: str = "bundled"  # bundled | wiki18-100k | wiki18 | path to a Search-R1 JSONL(.gz)
    index_dir: Path | None = None  # explicit index directory; default derived from corpus+encoder+index type
    encoder: str = (
        "bundled-minilm"  # bundled-minilm | intfloat/e5-base-v2 | BAAI/bge-base-en-v1.5 | local folder
    )
    index_type: str = "Flat"  # a FAISS factory string: Flat, HNSW32, IVF4096,SQ8, IVF4096,PQ64, ...
    build_if_missing: bool = True  # build the index on first use (bundled/local corpora only)

    # --- network and auth -----------------------------------------------------------------------------------
    host: str = "127.0.0.1"  # bind address; non-loopback needs an API key or insecure=True
    port: int = Field(default=8000, ge=1, le=65535)
    insecure: bool = False  # allow a public bind without an API key (never on an internet-facing port)
    api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("RETRIEVAL_API_KEY", "SEARCHRL_RETRIEVAL_API_KEY")
    )

    # --- request limits ------------------------------------------------------------------------------------
    topk: int = Field(default=3, ge=1)  # default results per query (Search-R1 recipe: 3)
    max_topk: int = Field(default=50, ge=1)  # larger topk is a 422
    max_queries: int = Field(default=256, ge=1)  # queries per request
    max_query_chars: int = Field(default=2048, ge=1)  # characters per query string

    # --- performance (issue 4) -----------------------------------------------------------------------------
    device: str = "auto"  # auto | cpu | cuda
    # auto: measured at start-up on CPU (issue 14), fp16 on GPU; int8 is ONNX Runtime only
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "auto"
    threads: int = Field(default=0, ge=0)  # torch/faiss threads; 0 = library default
    batch_size: int = Field(default=128, ge=1)  # most queries the batcher takes into one encode+search call
    # queries per encoder forward pass: a batch is sorted by length and split into passes this big, which cuts
    # padding (measured on 2 cores: 128 queries as 4 passes of 32 ran ~2.5x faster than as one pass of 128)
    forward_batch_size: int = Field(default=32, ge=1)
    batch_wait_ms: float = Field(default=2.0, ge=0)  # how long the batcher waits to fill a batch
    queue_size: int = Field(default=4096, ge=1)  # queued queries past which requests get 503
    request_timeout_s: float = Field(default=30.0, gt=0)  # per-request deadline
    cache_size: int = Field(default=100_000, ge=0)  # LRU result cache entries; 0 disables
    nprobe: int = Field(default=32, ge=1)  # IVF lists probed per query
    ef_search: int = Field(default=128, ge=1)  # HNSW search depth
    train_sample: int = Field(default=262_144, ge=1)  # vectors that train IVF/PQ index types (>= 39 per list)

    # --- index building (issue 2) -----------------------------------------------------------------------
    encoder_max_length: int = Field(default=256, ge=8)  # tokens per query/passage; longer text is truncated
    encode_batch_size: int = Field(default=64, ge=1)  # passages per forward pass when building an index

    # --- web backends (issue 6): google | serper | searxng ------------------------------------------------
    google_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GOOGLE_API_KEY", "SEARCHRL_RETRIEVAL_GOOGLE_API_KEY")
    )  # Custom Search JSON API key; pass with --secret, never --env or argv
    google_cse_id: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("GOOGLE_CSE_ID", "SEARCHRL_RETRIEVAL_GOOGLE_CSE_ID")
    )  # Programmable Search Engine id (the `cx` parameter)
    google_base_url: str = "https://www.googleapis.com/customsearch/v1"  # tests point this at a local fake
    serper_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SERPER_API_KEY", "SEARCHRL_RETRIEVAL_SERPER_API_KEY")
    )  # serper.dev key, sent as the X-API-KEY header
    serper_base_url: str = "https://google.serper.dev/search"  # POST endpoint
    searxng_base_url: str = "http://127.0.0.1:8888"  # a SearXNG instance with the json format enabled
    web_timeout_s: float = Field(default=10.0, gt=0)  # per upstream HTTP request
    web_max_retries: int = Field(default=3, ge=0)  # extra attempts on 429/5xx/timeouts/connection errors
    web_backoff_base_s: float = Field(default=0.5, ge=0)  # first back-off; doubles per attempt, jittered
    web_backoff_max_s: float = Field(default=8.0, ge=0)  # cap on one back-off (and on honoured Retry-After)
    web_rate_limit_rps: float = Field(default=5.0, ge=0)  # upstream requests per second; 0 = unlimited
    web_daily_budget: int = Field(default=100, ge=0)  # upstream requests per UTC day; 0 = unlimited
    web_concurrency: int = Field(default=8, ge=1)  # upstream requests in flight at once

    # --- hybrid backend (issue 6): dense + bm25 fused with reciprocal rank fusion ----------------------------
    hybrid_rrf_k: float = Field(default=60.0, gt=0)  # RRF constant: score = sum w / (k + rank)
    hybrid_dense_weight: float = Field(default=1.0, ge=0)  # weight of the dense ranking
    hybrid_bm25_weight: float = Field(default=1.0, ge=0)  # weight of the BM25 ranking
    hybrid_depth: int = Field(default=20, ge=1)  # candidates taken from each ranking before fusing

    # --- persistent query cache (issue 6) ------------------------------------------------------------------
    # off | on (read-through) | record (always ask upstream, store) | replay (cache only; a miss is an error)
    cache_mode: Literal["off", "on", "record", "replay"] = "off"
    cache_path: Path | None = None  # SQLite file; default <data_dir>/query_cache.sqlite
    cache_ttl_s: float = Field(default=0.0, ge=0)  # older entries are misses in `on` mode; 0 = never stale

    # --- query encoder backend, workers and start-up auto-tuning (issue 14; retrieval/encoder_tuning.py) -----
    encoder_backend: Literal["auto", "torch", "onnx"] = "auto"  # auto: the fastest that passes the gate
    encoder_workers: int = Field(default=0, ge=0)  # encoder workers behind the batcher; 0 = tuned (CPU)
    encoder_pin: bool = True  # pin each encoder worker's threads to its own cores (sched_setaffinity)
    autotune: bool = True  # measure backend/precision/workers/threads/forward batch at start-up (cached)
    autotune_seconds: float = Field(default=0.4, gt=0)  # seconds per measured configuration
    gate_min_recall: float = Field(default=0.99, ge=0, le=1)  # recall@3 vs the fp32 torch encoder to serve
    gate_queries: int = Field(default=400, ge=10)  # queries the quality gate checks (dev QA + corpus-derived)

    @model_validator(mode="after")
    def _check(self) -> RetrievalSettings:
        if self.topk > self.max_topk:
            raise ValueError(f"topk ({self.topk}) must not exceed max_topk ({self.max_topk})")
        if (self.encoder_backend, self.precision) in {("torch", "int8"), ("onnx", "bf16"), ("onnx", "fp16")}:
            raise ValueError(
                f"precision {self.precision} does not run on encoder_backend {self.encoder_backend}: int8 is "
                "ONNX Runtime only, bf16/fp16 are torch only (or leave encoder_backend=auto)"
            )
        if self.hybrid_dense_weight == 0 and self.hybrid_bm25_weight == 0:
            raise ValueError("hybrid_dense_weight and hybrid_bm25_weight are both 0: give one a weight > 0")
        return self

    @property
    def is_public_bind(self) -> bool:
        return self.host not in LOOPBACK_HOSTS

    def api_key_value(self) -> str | None:
        """The key in clear, for the one place that compares it; never log the result."""
        return self.api_key.get_secret_value() if self.api_key and self.api_key.get_secret_value() else None
