"""Web search backends: Google results through a SERP provider (Serper, SerpAPI), SearXNG, and the closing
Google Custom Search JSON API, behind the same /retrieve.

    SEARCHRL_RETRIEVAL_BACKEND=google SERPER_API_KEY=... searchrl serve            # Google via Serper
    SEARCHRL_RETRIEVAL_BACKEND=google SEARCHRL_RETRIEVAL_GOOGLE_PROVIDER=serpapi SERPAPI_API_KEY=... searchrl serve

`google` means Google's results bought from a SERP provider (Serper by default; SerpAPI, which Search-R1
recommends). `google-cse` is Google's Custom Search JSON API: closed to new customers, and its whole-web search
ends on 2027-01-01 (only site search over up to 50 domains remains), so it warns at start.
Every provider is asked with the same pinned country and language (`gl`, `hl`), results from sites that host
the benchmarks' Q/A pairs are dropped (`web_blocklist`), and in page mode (`web_page_mode`) the result pages are
fetched, cleaned and cut into ~100-word passages, so a web run reads passages of the size Wikipedia runs read
instead of two-line snippets. Page fetching and its guard (public addresses only, a byte cap, a time budget per
page within the request's deadline) live in pages.py, HTML to passage in page_text.py.

The trainer and the agent only speak /retrieve, so swapping Wikipedia for the web is a service setting. What
public web wrappers lack, and these add: a timeout per request, retries with jittered exponential back-off on
429/5xx/timeouts (honouring Retry-After), a client-side rate limit, a daily request budget that fails loudly
(`QuotaExceededError`, HTTP 429 at the app) instead of running up a bill, and explicit `BackendError`s instead
of silently empty result lists.

Secrets: the Google key travels as the `key=` query parameter (the documented way). It is added to the URL by
`SecretTransport` (transport.py) below the httpx client, so the `httpx.Request` that httpx logs ("HTTP Request:
GET ...") and that our messages could mention never holds it; upstream error text is also scrubbed of it.

Each result becomes a Search-R1 document: `id` = the URL, `contents` = '"Title"\\nsnippet', plus `url`.
Scores are rank-based (1/rank): web APIs return an order, not a score.

One module per job: throttle.py (rate limit, daily budget), transport.py (secrets below the client, upstream
error text), backend.py (`WebBackend`: lifecycle, retries, blocklist, page mode), pages.py and page_text.py (page
mode's fetch and HTML to passage), then one provider per file:
cse.py, serper.py, serpapi.py, searxng.py, and google.py (`google`: Serper or SerpAPI).
"""

from __future__ import annotations

from searchrl.retrieval.backends.web.backend import WebBackend, make_document
from searchrl.retrieval.backends.web.cse import CSE_SUNSET, GoogleCSEBackend
from searchrl.retrieval.backends.web.google import GoogleBackend
from searchrl.retrieval.backends.web.page_text import best_passage, page_text
from searchrl.retrieval.backends.web.searxng import SearxngBackend
from searchrl.retrieval.backends.web.serpapi import SerpApiBackend
from searchrl.retrieval.backends.web.serper import SerperBackend
from searchrl.retrieval.backends.web.throttle import DailyBudget, RateLimiter

__all__ = [
    "CSE_SUNSET",
    "DailyBudget",
    "GoogleBackend",
    "GoogleCSEBackend",
    "RateLimiter",
    "SearxngBackend",
    "SerpApiBackend",
    "SerperBackend",
    "WebBackend",
    "best_passage",
    "make_document",
    "page_text",
]
