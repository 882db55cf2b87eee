"""The /retrieve wire format (Search-R1 contract), shared by the service and every client.

Request, either style:
    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}      Search-R1 / verl batch body
    {"query": "q1", "topk": 3, "return_scores": true}                 SkyRL single-query body
Response: one inner list per query, in query order, best first:
    return_scores=true:   {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...]]}
    return_scores=false:  {"result": [[{"id": "...", "contents": "..."}, ...]]}
Errors: HTTP 4xx/5xx with {"detail": "<what is wrong>"}.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator


class RetrieveRequest(BaseModel):
    """A /retrieve body; exactly one of `queries` (batch) or `query` (single) is given.

    Limits that depend on the server (max topk, max queries, max query length) are checked by the app.
    """

    model_config = ConfigDict(extra="forbid")

    queries: list[StrictStr] | None = None
    query: StrictStr | None = None
    topk: StrictInt | None = Field(
        default=None, description="results per query; the server default if omitted"
    )
    return_scores: StrictBool = False

    @model_validator(mode="after")
    def _one_style(self) -> RetrieveRequest:
        if self.queries is None and self.query is None:
            raise ValueError('body needs "queries" (a list of strings) or "query" (a string)')
        if self.queries is not None and self.query is not None:
            raise ValueError('give either "queries" or "query", not both')
        if self.queries is not None and len(self.queries) == 0:
            raise ValueError('"queries" is empty: send at least one query')
        if self.topk is not None and self.topk < 1:
            raise ValueError(f'"topk" must be at least 1, got {self.topk}')
        return self

    @property
    def query_list(self) -> list[str]:
        """The queries in request order, whatever the body style."""
        return list(self.queries) if self.queries is not None else [self.query or ""]


class Document(BaseModel):
    """A corpus row as Search-R1 stores it; web backends add fields such as `url`."""

    model_config = ConfigDict(extra="allow")

    id: str
    contents: str


class ScoredDocument(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[ScoredDocument]] | list[list[Document]]


def hits_to_payload(hits: list[list[ScoredDocument]], *, return_scores: bool) -> dict[str, Any]:
    """Render backend hits in the requested shape (scored objects or bare documents)."""
    if return_scores:
        return {"result": [[h.model_dump() for h in per_query] for per_query in hits]}
    return {"result": [[h.document.model_dump() for h in per_query] for per_query in hits]}


__all__ = ["Document", "RetrieveRequest", "RetrieveResponse", "ScoredDocument", "hits_to_payload"]
