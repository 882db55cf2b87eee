"""A local fake of the web search APIs the web backends call, speaking their real wire formats.

Serves, on one FastAPI app (run it with tests.live.serve_in_thread):
  GET  /customsearch/v1   Google Custom Search JSON API (key, cx, q, num 1-10, start; start + num <= 100)
  POST /serper/search     serper.dev (X-API-KEY header, JSON {"q", "num", "gl", "hl"})
  GET  /serpapi/search.json  SerpAPI (engine=google, q, num, gl, hl, api_key; `organic_results`, {"error"})
  GET  /searxng/search    SearXNG (q, format=json, pageno; 10 results a page)
  GET  /pages/{title}     an HTML article page for a corpus passage (navigation, script and footer around it),
                          linked from Serper/SerpAPI results when `link_pages` is set (page-mode tests)
`prepend` puts extra organic results (title, url, snippet) first, e.g. a benchmark answer key on huggingface.co.
Answers come from the 20-passage tiny corpus ranked by query-term overlap, rendered as Wikipedia hits in the
providers' response formats, or, for RECORDED queries, a captured-format Custom Search response verbatim.
`plan` injects failures for the next requests: "429" (per-minute rate limit), "429-daily" (daily quota),
"500", "503", or ("sleep", seconds) then a normal answer. Every request is logged in `requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import TINY_CORPUS
from tests.live import healthy_app, serve_in_thread

GOOGLE_KEY = "AIzaSyD-fake-google-key-7f3a9c1e5b"
CSE_ID = "017576662512468239146:omuauf_lfve"
SERPER_KEY = "serper-fake-key-4b8d2e6f0a"
SERPAPI_KEY = "serpapi-fake-key-9c1d3e5f7a2b"

WIKI = "https://en.wikipedia.org/wiki/"
URL_TEMPLATE = (
    "https://www.googleapis.com/customsearch/v1?q={searchTerms}&num={count?}&start={startIndex?}"
    "&lr={language?}&safe={safe?}&cx={cx?}&sort={sort?}&filter={filter?}&gl={gl?}&cr={cr?}"
    "&googlehost={googleHost?}&c2coff={disableCnTwTranslation?}&hq={hq?}&hl={hl?}&siteSearch={siteSearch?}"
    "&siteSearchFilter={siteSearchFilter?}&exactTerms={exactTerms?}&excludeTerms={excludeTerms?}"
    "&linkSite={linkSite?}&orTerms={orTerms?}&dateRestrict={dateRestrict?}&lowRange={lowRange?}"
    "&highRange={highRange?}&searchType={searchType}&fileType={fileType?}&rights={rights?}&imgSize={imgSize?}"
    "&imgType={imgType?}&imgColorType={imgColorType?}&imgDominantColor={imgDominantColor?}&alt=json"
)

# A Custom Search page in the shape the API returns: snippets with a date prefix, newlines and
# non-breaking spaces, one item without a snippet, and the same link twice (pages shift between requests).
RECORDED: dict[str, dict[str, Any]] = {
    "bergman seventh seal knight chess": {
        "kind": "customsearch#search",
        "url": {"type": "application/json", "template": URL_TEMPLATE},
        "queries": {
            "request": [
                {
                    "title": "Google Custom Search - bergman seventh seal knight chess",
                    "totalResults": "48200",
                    "searchTerms": "bergman seventh seal knight chess",
                    "count": 4,
                    "startIndex": 1,
                    "inputEncoding": "utf8",
                    "outputEncoding": "utf8",
                    "safe": "off",
                    "cx": "REDACTED",
                }
            ],
            "nextPage": [
                {
                    "title": "Google Custom Search - bergman seventh seal knight chess",
                    "totalResults": "48200",
                    "searchTerms": "bergman seventh seal knight chess",
                    "count": 4,
                    "startIndex": 5,
                    "inputEncoding": "utf8",
                    "outputEncoding": "utf8",
                    "safe": "off",
                    "cx": "REDACTED",
                }
            ],
        },
        "context": {"title": "searchrl-test"},
        "searchInformation": {
            "searchTime": 0.351232,
            "formattedSearchTime": "0.35",
            "totalResults": "48200",
            "formattedTotalResults": "48,200",
        },
        "items": [
            {
                "kind": "customsearch#result",
                "title": "The Seventh Seal - Wikipedia",
                "htmlTitle": "The <b>Seventh Seal</b> - Wikipedia",
                "link": "https://en.wikipedia.org/wiki/The_Seventh_Seal",
                "displayLink": "en.wikipedia.org",
                "snippet": "The Seventh Seal is a 1957 Swedish historical fantasy film written and\ndirected by "
                "Ingmar Bergman. Set in Sweden during the Black Death,\xa0...",
                "htmlSnippet": "The <b>Seventh Seal</b> is a 1957 Swedish historical fantasy film written "
                "and<br>\ndirected by Ingmar <b>Bergman</b>. Set in Sweden during the Black Death,&nbsp;...",
                "formattedUrl": "https://en.wikipedia.org/wiki/The_Seventh_Seal",
                "htmlFormattedUrl": "https://en.wikipedia.org/wiki/The_<b>Seventh</b>_<b>Seal</b>",
                "pagemap": {"metatags": [{"og:title": "The Seventh Seal - Wikipedia"}]},
            },
            {
                "kind": "customsearch#result",
                "title": "The Seventh Seal (1957) - IMDb",
                "htmlTitle": "The <b>Seventh Seal</b> (1957) - IMDb",
                "link": "https://www.imdb.com/title/tt0050976/",
                "displayLink": "www.imdb.com",
                "snippet": "Feb 16, 1957 ... A disillusioned knight returning from the Crusades plays a "
                "game of\nchess with Death.",
                "htmlSnippet": "Feb 16, 1957 <b>...</b> A disillusioned <b>knight</b> returning from the "
                "Crusades plays a game of<br>\n<b>chess</b> with Death.",
                "cacheId": "k3p_x1Yh0bIJ",
                "formattedUrl": "https://www.imdb.com/title/tt0050976/",
                "htmlFormattedUrl": "https://www.imdb.com/title/tt0050976/",
            },
            {
                "kind": "customsearch#result",
                "title": "The Seventh Seal - Wikipedia",
                "htmlTitle": "The <b>Seventh Seal</b> - Wikipedia",
                "link": "https://en.wikipedia.org/wiki/The_Seventh_Seal",
                "displayLink": "en.wikipedia.org",
                "snippet": "Duplicate of the first item.",
                "htmlSnippet": "Duplicate of the first item.",
                "formattedUrl": "https://en.wikipedia.org/wiki/The_Seventh_Seal",
                "htmlFormattedUrl": "https://en.wikipedia.org/wiki/The_Seventh_Seal",
            },
            {
                "kind": "customsearch#result",
                "title": "Ingmar Bergman Foundation",
                "htmlTitle": "Ingmar <b>Bergman</b> Foundation",
                "link": "https://www.ingmarbergman.se/en",
                "displayLink": "www.ingmarbergman.se",
                "formattedUrl": "https://www.ingmarbergman.se/en",
                "htmlFormattedUrl": "https://www.ingmar<b>bergman</b>.se/en",
            },
        ],
    }
}

_GOOGLE_ERRORS: dict[str, tuple[int, str, str, str]] = {
    # plan item -> (HTTP status, message, reason, status) as the API words them
    "429": (
        429,
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
        "'customsearch.googleapis.com' for consumer 'project_number:123456789'.",
        "rateLimitExceeded",
        "RESOURCE_EXHAUSTED",
    ),
    "429-daily": (
        429,
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per day' of service "
        "'customsearch.googleapis.com' for consumer 'project_number:123456789'.",
        "rateLimitExceeded",
        "RESOURCE_EXHAUSTED",
    ),
    "500": (500, "Backend Error", "backendError", "INTERNAL"),
    "503": (503, "The service is currently unavailable.", "backendError", "UNAVAILABLE"),
}


def google_error(code: int, message: str, reason: str, status: str) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": status,
        }
    }


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class FakeSearchAPIs:
    """State of the fake: the corpus, the expected credentials, the failure plan and the request log."""

    def __init__(self, corpus: Path, *, google_key: str, cse_id: str, serper_key: str) -> None:
        self.passages: list[tuple[str, str]] = []
        for line in corpus.read_text().splitlines():
            title, _, text = json.loads(line)["contents"].partition("\n")
            self.passages.append((title.strip('"'), text))
        self.google_key, self.cse_id, self.serper_key = google_key, cse_id, serper_key
        self.url = ""  # set once served
        self.plan: deque[Any] = deque()
        self.requests: list[dict[str, Any]] = []
        self.serpapi_key = SERPAPI_KEY
        self.link_pages = False
        self.prepend: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.plan.clear()
            self.requests.clear()

    def count(self, api: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if api is None or r["api"] == api)

    def ranked(self, query: str) -> list[tuple[str, str]]:
        """Passages sharing a term with the query, most shared terms first (title order breaks ties)."""
        q = set(_tokens(query))
        scored = [(len(q & set(_tokens(t + " " + x))), t, x) for t, x in self.passages]
        return [(t, x) for s, t, x in sorted(scored, key=lambda r: (-r[0], r[1])) if s > 0]

    async def _next_action(self, api: str, params: dict[str, Any]) -> Any:
        with self._lock:
            self.requests.append({"api": api, "params": params, "t": time.monotonic()})
            action = self.plan.popleft() if self.plan else None
        if isinstance(action, tuple) and action[0] == "sleep":
            await asyncio.sleep(action[1])
            return None
        return action

    def organic(self, query: str, num: int) -> list[dict[str, Any]]:
        """Serper/SerpAPI organic results: `prepend` first, then corpus hits (linked to /pages when asked)."""
        out = [{"title": t, "link": u, "snippet": x} for t, u, x in self.prepend]
        for t, x in self.ranked(query):
            link = (
                f"{self.url}/pages/{t.replace(' ', '_')}" if self.link_pages else WIKI + t.replace(" ", "_")
            )
            out.append({"title": f"{t} - Wikipedia", "link": link, "snippet": x[:150] + "..."})
        return [{**o, "position": i} for i, o in enumerate(out[:num], start=1)]

    def page_html(self, title: str) -> str | None:
        text = next((x for t, x in self.passages if t == title), None)
        if text is None:
            return None
        return (
            "<html><head><title>" + title + "</title><script>var tracking = 'do not read this';</script>"
            "<style>body{font-family:serif}</style></head><body>"
            "<nav><a href='/'>Home</a> <a href='/random'>Random article</a> Donate Log in</nav>"
            "<header>From Wikipedia, the free encyclopedia</header>"
            f"<article><h1>{title}</h1><p>{text}</p>"
            "<p>This paragraph is filler about unrelated matters such as weather patterns, railway timetables and "
            "the price of bread in several provincial markets during the nineteenth century, repeated. "
            * 3
            + "</p></article><footer>Text is available under the Creative Commons Attribution-ShareAlike "
            "License; additional terms may apply. Privacy policy About Disclaimers</footer></body></html>"
        )

    # --- Google Custom Search ----------------------------------------------------------------------------
    def google_page(self, query: str, num: int, start: int) -> dict[str, Any]:
        hits = self.ranked(query)
        page = hits[start - 1 : start - 1 + num]
        total = str(len(hits))

        def req(start_index: int) -> dict[str, Any]:
            return {
                "title": f"Google Custom Search - {query}",
                "totalResults": total,
                "searchTerms": query,
                "count": num,
                "startIndex": start_index,
                "inputEncoding": "utf8",
                "outputEncoding": "utf8",
                "safe": "off",
                "cx": self.cse_id,
            }

        queries: dict[str, Any] = {"request": [req(start)]}
        if start - 1 + num < len(hits):
            queries["nextPage"] = [req(start + num)]
        if start > 1:
            queries["previousPage"] = [req(max(1, start - num))]
        body: dict[str, Any] = {
            "kind": "customsearch#search",
            "url": {"type": "application/json", "template": URL_TEMPLATE},
            "queries": queries,
            "context": {"title": "searchrl-test"},
            "searchInformation": {
                "searchTime": 0.21,
                "formattedSearchTime": "0.21",
                "totalResults": total,
                "formattedTotalResults": f"{len(hits):,}",
            },
        }
        if page:  # like the real API, a page with no results has no "items" key at all
            body["items"] = [
                {
                    "kind": "customsearch#result",
                    "title": f"{title} - Wikipedia",
                    "htmlTitle": f"{title} - Wikipedia",
                    "link": WIKI + title.replace(" ", "_"),
                    "displayLink": "en.wikipedia.org",
                    "snippet": text[:150] + "\xa0...",
                    "htmlSnippet": text[:150] + "&nbsp;...",
                    "formattedUrl": WIKI + title.replace(" ", "_"),
                    "htmlFormattedUrl": WIKI + title.replace(" ", "_"),
                    "pagemap": {"metatags": [{"og:title": title}]},
                }
                for title, text in page
            ]
        return body

    def app(self) -> FastAPI:
        app = healthy_app()

        @app.get("/customsearch/v1")
        async def customsearch(request: Request) -> JSONResponse:
            p = dict(request.query_params)
            action = await self._next_action("google", p)
            if action in _GOOGLE_ERRORS:
                return JSONResponse(
                    google_error(*_GOOGLE_ERRORS[action]), status_code=_GOOGLE_ERRORS[action][0]
                )
            if p.get("key") != self.google_key:
                msg = "API key not valid. Please pass a valid API key."
                return JSONResponse(google_error(400, msg, "badRequest", "INVALID_ARGUMENT"), status_code=400)
            num, start = int(p.get("num", 10)), int(p.get("start", 1))
            if (
                p.get("cx") != self.cse_id
                or not p.get("q")
                or not 1 <= num <= 10
                or start < 1
                or start + num > 100
            ):
                msg = "Request contains an invalid argument."
                return JSONResponse(google_error(400, msg, "badRequest", "INVALID_ARGUMENT"), status_code=400)
            if p["q"] in RECORDED and start == 1:
                return JSONResponse(RECORDED[p["q"]])
            return JSONResponse(self.google_page(p["q"], num, start))

        @app.post("/serper/search")
        async def serper(request: Request) -> JSONResponse:
            body = await request.json()
            action = await self._next_action("serper", body)
            if action in ("500", "503"):
                return JSONResponse(
                    {"message": "Internal error", "statusCode": int(action)}, status_code=int(action)
                )
            if request.headers.get("x-api-key") != self.serper_key:
                return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
            return JSONResponse(
                {
                    "searchParameters": {
                        "q": body["q"],
                        "gl": body.get("gl", "us"),
                        "hl": body.get("hl", "en"),
                        "type": "search",
                        "num": body.get("num", 10),
                        "engine": "google",
                    },
                    "organic": self.organic(body["q"], int(body.get("num", 10))),
                    "credits": 1,
                }
            )

        @app.get("/serpapi/search.json")
        async def serpapi(request: Request) -> JSONResponse:
            p = dict(request.query_params)
            action = await self._next_action("serpapi", p)
            if action == "429-daily":
                return JSONResponse({"error": "Your account has run out of searches."}, status_code=429)
            if action in ("500", "503"):
                return JSONResponse({"error": "Internal error."}, status_code=int(action))
            if p.get("api_key") != self.serpapi_key:
                return JSONResponse(
                    {
                        "error": "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"
                    },
                    status_code=401,
                )
            if p.get("engine") != "google" or not p.get("q"):
                return JSONResponse({"error": "Missing query `q` parameter."}, status_code=400)
            organic = self.organic(p["q"], int(p.get("num", 10)))
            body: dict[str, Any] = {
                "search_metadata": {
                    "id": "fake",
                    "status": "Success",
                    "json_endpoint": "https://serpapi.com/x",
                },
                "search_parameters": {k: v for k, v in p.items() if k != "api_key"},
            }
            if organic:
                body["organic_results"] = organic
            else:
                body["error"] = "Google hasn't returned any results for this query."
            return JSONResponse(body)

        @app.get("/pages/{name}")
        async def page(name: str) -> HTMLResponse:
            await self._next_action("page", {"name": name})
            html = self.page_html(name.replace("_", " "))
            if html is None:
                return HTMLResponse("<html><body>Not found</body></html>", status_code=404)
            return HTMLResponse(html)

        @app.get("/searxng/search")
        async def searxng(request: Request) -> JSONResponse:
            p = dict(request.query_params)
            await self._next_action("searxng", p)
            if p.get("format") != "json":
                return JSONResponse({"detail": "format not allowed"}, status_code=403)
            page = int(p.get("pageno", 1))
            hits = self.ranked(p["q"])[(page - 1) * 10 : page * 10]
            return JSONResponse(
                {
                    "query": p["q"],
                    "number_of_results": 0,
                    "results": [
                        {
                            "url": WIKI + t.replace(" ", "_"),
                            "title": t,
                            "content": x[:150],
                            "engine": "wikipedia",
                            "engines": ["wikipedia"],
                            "positions": [i],
                            "score": 1.0 / i,
                            "category": "general",
                        }
                        for i, (t, x) in enumerate(hits, start=1)
                    ],
                    "answers": [],
                    "corrections": [],
                    "infoboxes": [],
                    "suggestions": [],
                    "unresponsive_engines": [],
                }
            )

        return app


@contextlib.contextmanager
def serve_fake() -> Iterator[FakeSearchAPIs]:
    """The fake on a free loopback port for the duration of the block."""
    apis = FakeSearchAPIs(TINY_CORPUS, google_key=GOOGLE_KEY, cse_id=CSE_ID, serper_key=SERPER_KEY)
    with serve_in_thread(apis.app()) as url:
        apis.url = url
        yield apis


def web_settings(fake: FakeSearchAPIs, backend: str = "google-cse", **kw: Any) -> RetrievalSettings:
    """Settings pointing every web backend at the fake, with test-sized back-off and no rate limit."""
    base: dict[str, Any] = dict(
        backend=backend,
        google_api_key=GOOGLE_KEY,
        google_cse_id=CSE_ID,
        serper_api_key=SERPER_KEY,
        serpapi_api_key=SERPAPI_KEY,
        serpapi_base_url=f"{fake.url}/serpapi/search.json",
        google_base_url=f"{fake.url}/customsearch/v1",
        serper_base_url=f"{fake.url}/serper/search",
        searxng_base_url=f"{fake.url}/searxng",
        web_backoff_base_s=0.01,
        web_backoff_max_s=0.05,
        web_rate_limit_rps=0,
        web_timeout_s=2.0,
    )
    base.update(kw)
    return RetrievalSettings(**base)
