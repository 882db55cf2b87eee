"""Backend `google-cse`: Google's Custom Search JSON API (closed to new customers; whole-web search ends 2027-01-01)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from pydantic import SecretStr

from searchrl.errors import BackendError
from searchrl.retrieval.backends.web.backend import (
    WebBackend,
    make_document,
    rank_scored,
    require_secrets,
)
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

# Custom Search returns at most 100 results, 10 per request; start + num above 100 is an error.
# https://developers.google.com/custom-search/v1/reference/rest/v1/cse/list
GOOGLE_MAX_NUM = 10
GOOGLE_MAX_RESULTS = 100
CSE_SUNSET = "2027-01-01"


class GoogleCSEBackend(WebBackend):
    """Google Programmable Search (Custom Search JSON API): GET with key, cx, q, num (1-10), start.

    Top-k above 10 pages with `start` (1, 11, 21, ...); each page is one billed request. The API never
    returns more than 100 results. https://developers.google.com/custom-search/v1/using_rest
    Closed to new customers; whole-web search ends on 2027-01-01 (DESIGN.md 5b), hence the start-up warning.
    """

    name = "google-cse"
    credentials_hint = "GOOGLE_API_KEY and GOOGLE_CSE_ID"
    extra_results = 0
    # Google says which limit was hit: "... limit 'Queries per day' ..." vs "... per minute ...".
    daily_quota_phrase = "per day"

    async def start(self) -> None:
        log.warning(
            "backend google-cse: Google's Custom Search JSON API is closed to new customers and its whole-web "
            "search ends on %s; use backend google (Serper or SerpAPI) for Google results",
            CSE_SUNSET,
        )
        await super().start()

    def __init__(
        self, settings: RetrievalSettings, *, api_key: SecretStr, cse_id: SecretStr, **kwargs: Any
    ) -> None:
        self._cse_id_hash = hashlib.sha256(cse_id.get_secret_value().encode()).hexdigest()[:12]
        super().__init__(settings, secret_params={"key": api_key, "cx": cse_id}, **kwargs)

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> GoogleCSEBackend:
        key, cx = require_secrets(
            "google-cse", GOOGLE_API_KEY=settings.google_api_key, GOOGLE_CSE_ID=settings.google_cse_id
        )
        return cls(settings, api_key=key, cse_id=cx, base_url=settings.google_base_url)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "engine": f"sha256:{self._cse_id_hash}"}

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        want = min(topk, GOOGLE_MAX_RESULTS - 1)
        docs: list[Document] = []
        start = 1
        while len(docs) < want:
            num = min(GOOGLE_MAX_NUM, want - len(docs), GOOGLE_MAX_RESULTS - start)
            if num < 1:
                break
            params = {"q": query, "num": num, "start": start, "gl": self.gl, "hl": self.hl}
            body = await self._request("GET", self.base_url, params=params)
            if not isinstance(body, dict) or ("items" not in body and "searchInformation" not in body):
                raise BackendError(f"google-cse: unexpected response shape (keys: {sorted(body)[:8]})")
            items = body.get("items") or []
            for item in items:
                link = item.get("link")
                if link:
                    docs.append(
                        make_document(
                            item.get("title", ""),
                            item.get("snippet", ""),
                            link,
                            display_link=item.get("displayLink", ""),
                        )
                    )
            next_page = (body.get("queries") or {}).get("nextPage") or []
            if len(items) < num or not next_page:
                break
            start = int(next_page[0].get("startIndex", start + len(items)))
        return rank_scored(docs, topk)


__all__ = ["CSE_SUNSET", "GoogleCSEBackend"]
