"""Backend `searxng`: a SearXNG instance's JSON API (no key)."""

from __future__ import annotations

from searchrl.errors import BackendError
from searchrl.retrieval.backends.web.backend import WebBackend, make_document, rank_scored
from searchrl.retrieval.schemas import Document, ScoredDocument
from searchrl.retrieval.settings import RetrievalSettings

SEARXNG_MAX_PAGES = 10


class SearxngBackend(WebBackend):
    """A SearXNG instance: GET /search?q=...&format=json&pageno=N, no key (json must be enabled).

    SearXNG has no page size: pages are fetched until top-k unique results or an empty page.
    """

    name = "searxng"
    credentials_hint = "that the instance enables the json format (search.formats in settings.yml)"

    @classmethod
    def from_settings(cls, settings: RetrievalSettings) -> SearxngBackend:
        return cls(settings, base_url=settings.searxng_base_url)

    async def _search_one(self, query: str, topk: int) -> list[ScoredDocument]:
        docs: list[Document] = []
        seen: set[str] = set()
        for page in range(1, SEARXNG_MAX_PAGES + 1):
            body = await self._request(
                "GET", f"{self.base_url}/search", params={"q": query, "format": "json", "pageno": page}
            )
            if not isinstance(body, dict) or not isinstance(body.get("results"), list):
                raise BackendError("searxng: unexpected response shape (no 'results' list)")
            fresh = [r for r in body["results"] if r.get("url") and r["url"] not in seen]
            for r in fresh:
                seen.add(r["url"])
                docs.append(make_document(r.get("title", ""), r.get("content", ""), r["url"]))
            if not fresh or len(docs) >= topk:
                break
        return rank_scored(docs, topk)


__all__ = ["SearxngBackend"]
