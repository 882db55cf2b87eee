"""Backend `serpapi`: Google results from serpapi.com (the provider Search-R1 recommends)."""

from __future__ import annotations

from searchrl.errors import BackendError
from searchrl.retrieval.backends.web.backend import (
    WebBackend,
    organic_documents,
    rank_scored,
    require_secrets,
)
from searchrl.retrieval.schemas import ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings

SERPAPI_MAX_NUM = 100


class SerpApiBackend(WebBackend):
    """serpapi.com Google results: GET search.json?engine=google&q&num&gl&hl with the key as `api_key`.

    The key is a query parameter added below the HTTP client (as for CSE), so logs and errors never hold it.
    https://serpapi.com/search-api ; errors come as {"error": "..."}; a spent plan is HTTP 429
    "Your account has run out of searches."
    """

    name = "serpapi"
    credentials_hint = "SERPAPI_API_KEY"
    daily_quota_phrase = "run out of searches"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SerpApiBackend:
        (key,) = require_secrets("serpapi", SERPAPI_API_KEY=settings.serpapi_api_key)
        return cls(settings, base_url=settings.serpapi_base_url, secret_params={"api_key": key})

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        params = {
            "engine": "google",
            "q": query,
            "num": min(topk, SERPAPI_MAX_NUM),
            "gl": self.gl,
            "hl": self.hl,
        }
        body = await self._request("GET", self.base_url, params=params)
        if not isinstance(body, dict) or not isinstance(body.get("organic_results", []), list):
            raise BackendError("serpapi: unexpected response shape (no 'organic_results' list)")
        if body.get("error") and not body.get("organic_results"):
            if "hasn't returned any results" in str(body["error"]):
                return []
            raise BackendError(f"serpapi: {self._redact(str(body['error']))}")
        return rank_scored(organic_documents(body.get("organic_results", [])), topk)


__all__ = ["SerpApiBackend"]
