"""Backend `serper`: Google results from serper.dev."""

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

SERPER_MAX_NUM = 100


class SerperBackend(WebBackend):
    """serper.dev Google results: POST JSON {"q", "num"} with the key in the X-API-KEY header."""

    name = "serper"
    credentials_hint = "SERPER_API_KEY"
    daily_quota_phrase = "credits"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SerperBackend:
        (key,) = require_secrets("serper", SERPER_API_KEY=settings.serper_api_key)
        return cls(settings, base_url=settings.serper_base_url, secret_headers={"X-API-KEY": key})

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        num = min(topk, SERPER_MAX_NUM)
        body = await self._request(
            "POST", self.base_url, json={"q": query, "num": num, "gl": self.gl, "hl": self.hl}
        )
        if not isinstance(body, dict) or not isinstance(body.get("organic", []), list):
            raise BackendError("serper: unexpected response shape (no 'organic' list)")
        return rank_scored(organic_documents(body.get("organic", [])), topk)


__all__ = ["SerperBackend"]
