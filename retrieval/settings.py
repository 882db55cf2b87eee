"""RetrievalSettings: every knob of the retrieval service, from flags > env > .env > defaults.

Env names are SEARCHRL_RETRIEVAL_<FIELD>, except the ones users know from the Search-R1/SkyPilot recipes
(RETRIEVAL_API_KEY, GOOGLE_API_KEY, ...), which are declared as aliases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from searchrl.config import StrictSettings, area_config
from searchrl.errors import ConfigError
from searchrl.rollout import MAX_TOPK

BackendName = Literal["dense", "bm25", "hybrid", "google", "google-cse", "serper", "serpapi", "searxng"]
# Sites that host the benchmarks' question/answer pairs (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, Musique,
# Bamboogle and the trivia sites TriviaQA was scraped from): a web search that lands on them reads the answer key.
DEFAULT_WEB_BLOCKLIST = [
    "huggingface.co",
    "github.com",
    "kaggle.com",
    "paperswithcode.com",
    "arxiv.org",
    "quizlet.com",
    "sporcle.com",
    "jetpunk.com",
    "funtrivia.com",
    "quizballs.com",
    "triviaplaying.com",
    "hotpotqa.github.io",
    "ai.google.com",
    # dataset mirrors and Q&A sites (issue 23): raw files of the QA sets, and crowd answers to the questions
    "raw.githubusercontent.com",
    "hf-mirror.com",
    "modelscope.cn",
    "gitee.com",
    "answers.com",
    "brainly.com",
    "quora.com",
]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class RetrievalSettings(StrictSettings):
    model_config = area_config("SEARCHRL_RETRIEVAL_")

    # --- what to serve -------------------------------------------------------------------------------------
    backend: BackendName = "bm25"  # bm25 | dense | hybrid | google (SERP provider) | serper | serpapi | searxng | google-cse (closing)
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
    )  # bearer token clients must send; pass with --secret, never --env or argv
    api_key_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RETRIEVAL_API_KEY_FILE", "SEARCHRL_RETRIEVAL_API_KEY_FILE"),
    )  # file with the token on line 1 and, during a rotation, the previous token on line 2
    api_key_previous: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("RETRIEVAL_API_KEY_PREVIOUS", "SEARCHRL_RETRIEVAL_API_KEY_PREVIOUS"),
    )  # a second accepted token while clients move to the new one (rotation); unset it afterwards

    # --- request limits ------------------------------------------------------------------------------------
    topk: int = Field(default=3, ge=1)  # default results per query (Search-R1 recipe: 3)
    max_topk: int = Field(default=MAX_TOPK, ge=1)  # larger topk is a 422
    max_queries: int = Field(default=256, ge=1)  # queries per request
    max_query_chars: int = Field(default=2048, ge=1)  # characters per query string
    # request body bytes, refused with 413 while reading (before buffering); 4 MiB fits 256 x 2048 characters
    # even when every character is sent as a 6-byte \uXXXX escape (3.1 MB)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)

    # --- slow clients and overload (issue 13) ---------------------------------------------------------------
    header_timeout_s: float = Field(default=10.0, gt=0)  # a request's headers must arrive within this
    body_timeout_s: float = Field(default=10.0, gt=0)  # its body within this (else 408, connection closed)
    max_header_bytes: int = Field(default=65_536, ge=1024)  # bigger request headers: 431, connection closed
    max_connections: int = Field(default=2048, ge=1)  # open connections+requests; past it uvicorn sends 503
    keep_alive_s: int = Field(default=5, ge=1)  # idle keep-alive connections close after this
    retry_after_max_s: float = Field(default=5.0, gt=0)  # cap on Retry-After (below clients' 10 s timeout)
    drain_timeout_s: int = Field(default=30, ge=1)  # on SIGTERM: seconds to finish accepted requests
    # /ready says "busy" past this queue fill; it stays 200 (a saturated replica that works sheds with 503 at
    # /retrieve, so SkyServe keeps routing to it: docs/operations.md)
    ready_queue_fraction: float = Field(default=0.9, gt=0, le=1)
    worker_stall_s: float = Field(default=30.0, gt=0)  # /ready fails if one batch runs longer than this
    # one query through the index before the replica serves: a cold mmap'd Flat index reads every page on its
    # first search (wiki-18: 64.5 GB, ~516 s at 125 MB/s), which would otherwise hit the first real batch
    warm_up: bool = True
    # client side: a PEM certificate that clients of this service (the verl tool, eval, `searchrl health`) trust
    # for https:// URLs on top of the system's CAs, e.g. SkyServe's self-signed `service.tls` certificate
    # (retrieval/client/client.py reads it where each client is built; docs/deploy.md section 7)
    ca_bundle: Path | None = None

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
    # per-request deadline in the queue; below the client's 10 s timeout, so a request that cannot be served
    # in time gets a 503 + Retry-After it can act on instead of a client-side timeout
    request_timeout_s: float = Field(default=8.0, gt=0)
    cache_size: int = Field(default=100_000, ge=0)  # LRU result cache entries; 0 disables
    nprobe: int = Field(default=32, ge=1)  # IVF lists probed per query
    ef_search: int = Field(default=128, ge=1)  # HNSW search depth
    train_sample: int = Field(default=262_144, ge=1)  # vectors that train IVF/PQ index types (>= 39 per list)

    # --- index building (issue 2) -----------------------------------------------------------------------
    encoder_max_length: int = Field(default=256, ge=8)  # tokens per query/passage; longer text is truncated
    encode_batch_size: int = Field(default=64, ge=1)  # passages per forward pass when building an index

    # --- converting a Flat index (issue 48; retrieval/index/convert.py, arithmetic in docs/sizing.md) ----------------
    # vectors that train the converted index; 0 = 64 per IVF list, at least 65,536 (IVF16384: 1,048,576 = 3.2 GB)
    convert_train_sample: int = Field(default=0, ge=0)
    convert_chunk: int = Field(default=262_144, ge=1)  # Flat rows read, added, checkpointed together (805 MB)
    convert_min_recall: float = Field(default=0.90, ge=0, le=1)  # recall@3 vs Flat to install the result
    convert_queries: int = Field(default=500, ge=10)  # real questions the recall check encodes and searches
    convert_memory_gb: float = Field(default=0.0, ge=0)  # memory it may use; 0 = MemAvailable/cgroup limit

    # --- web backends (issues 6, 12): google (= serper | serpapi) | google-cse | serper | serpapi | searxng ------
    google_provider: Literal["serper", "serpapi"] = "serper"  # who sells Google results for backend `google`
    serpapi_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SERPAPI_API_KEY", "SEARCHRL_RETRIEVAL_SERPAPI_API_KEY")
    )  # serpapi.com key (the api_key query parameter, added below the HTTP client); pass with --secret
    serpapi_base_url: str = "https://serpapi.com/search.json"  # GET endpoint, engine=google
    web_gl: str = "us"  # Google country (gl): pinned so results do not move with the server's location
    web_hl: str = "en"  # Google interface language (hl)
    web_blocklist: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_WEB_BLOCKLIST)
    )  # comma-separated domains whose results are dropped (sites hosting benchmark Q/A pairs); "" = none
    web_page_mode: bool = False  # fetch result pages and return their best ~100-word passage, not the snippet
    web_page_words: int = Field(default=100, ge=20)  # passage length in page mode (wiki-18 passages are 100)
    web_page_timeout_s: float = Field(default=5.0, gt=0)  # one page's whole fetch, redirects included
    web_page_max_bytes: int = Field(default=2_000_000, ge=1024)  # decoded; a bigger page keeps its snippet
    web_page_allow_private: bool = False  # fetch private/loopback/link-local pages too
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
    # a SearXNG instance with the json format enabled, e.g. http://127.0.0.1:8888; required by backend searxng
    searxng_base_url: str = ""
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

    # --- query encoder backend, workers and start-up auto-tuning (issue 14; retrieval/encoders/tuning.py) -----
    encoder_backend: Literal["auto", "torch", "onnx"] = "auto"  # auto: the fastest that passes the gate
    encoder_workers: int = Field(default=0, ge=0)  # encoder workers behind the batcher; 0 = tuned (CPU)
    encoder_pin: bool = True  # pin each encoder worker's threads to its own cores (sched_setaffinity)
    autotune: bool = True  # measure backend/precision/workers/threads/forward batch at start-up (cached)
    autotune_seconds: float = Field(default=0.4, gt=0)  # seconds per measured configuration
    gate_min_recall: float = Field(default=0.99, ge=0, le=1)  # recall@3 vs the fp32 torch encoder to serve
    gate_queries: int = Field(default=400, ge=10)  # queries the quality gate checks (dev QA + corpus-derived)

    @field_validator("web_blocklist", mode="before")
    @classmethod
    def _split_blocklist(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [d.strip().lower() for d in value.split(",") if d.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> RetrievalSettings:
        if self.topk > self.max_topk:
            raise ValueError(f"topk ({self.topk}) must not exceed max_topk ({self.max_topk})")
        if (self.encoder_backend, self.precision) in {("torch", "int8"), ("onnx", "bf16"), ("onnx", "fp16")}:
            raise ValueError(
                f"precision {self.precision} does not run on encoder_backend {self.encoder_backend}: int8 is "
                "ONNX Runtime only, bf16/fp16 are torch only (or leave encoder_backend=auto)"
            )
        if self.backend == "searxng" and not self.searxng_base_url.strip().startswith(
            ("http://", "https://")
        ):
            # no default instance: a guessed 127.0.0.1:8888 passed /ready while every query was a 502 that
            # spent the daily budget on retries
            got = f"got {self.searxng_base_url!r}" if self.searxng_base_url.strip() else "it is not set"
            raise ValueError(
                f"backend searxng needs SEARCHRL_RETRIEVAL_SEARXNG_BASE_URL, the http(s) URL of your SearXNG "
                f"instance with the json format enabled, e.g. http://127.0.0.1:8888 ({got})"
            )
        if self.hybrid_dense_weight == 0 and self.hybrid_bm25_weight == 0:
            raise ValueError("hybrid_dense_weight and hybrid_bm25_weight are both 0: give one a weight > 0")
        return self

    @property
    def is_public_bind(self) -> bool:
        return self.host not in LOOPBACK_HOSTS

    def api_key_value(self) -> str | None:
        """The current key in clear (client side, health checks); never log the result."""
        keys = self.api_keys()
        return keys[0] if keys else None

    def api_keys(self) -> list[str]:
        """Every accepted token in clear (current first, then the previous one during a rotation), for the one
        place that compares them; never log the result. Reads RETRIEVAL_API_KEY_FILE on each call, so the
        caller decides when (the app reads it once at start-up)."""
        keys: list[str] = []
        if self.api_key_file is not None:
            try:
                lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read RETRIEVAL_API_KEY_FILE {self.api_key_file}: {exc.strerror or exc}"
                ) from None
            tokens = [line.strip() for line in lines if line.strip()]
            if not tokens or len(tokens) > 2:
                raise ConfigError(
                    f"RETRIEVAL_API_KEY_FILE {self.api_key_file} has {len(tokens)} tokens; put the current "
                    "token on line 1 and, during a rotation only, the previous one on line 2"
                )
            keys += tokens
        for secret in (self.api_key, self.api_key_previous):
            value = secret.get_secret_value().strip() if secret else ""
            if value and value not in keys:
                keys.append(value)
        if len(keys) > 2:
            raise ConfigError(
                "more than two accepted tokens: use RETRIEVAL_API_KEY (or line 1 of RETRIEVAL_API_KEY_FILE) for "
                "the current token and RETRIEVAL_API_KEY_PREVIOUS (or line 2) for the one being retired"
            )
        return keys
