"""What a client reads from /retrieve: `Hit`s, validated against the wire format in retrieval/schemas.py.

The service renders its answer from `ScoredDocument` (schemas.py); the client validates with the same model, so
the two sides cannot drift apart. Any shape problem is a `RetrievalUnavailableError` of kind "malformed": the
client does not retry it (the same replica would answer the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from searchrl.errors import RetrievalUnavailableError
from searchrl.prompt import split_title
from searchrl.retrieval.schemas import ScoredDocument


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    contents: str
    score: float
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. "url" from web backends

    @property
    def title(self) -> str:
        return split_title(self.contents)[0]

    @property
    def text(self) -> str:
        return split_title(self.contents)[1]


_SCORED_LIST = TypeAdapter(list[ScoredDocument])


def parse_result(payload: Any, n_queries: int) -> list[list[Hit]]:
    """Validate a `return_scores: true` response and turn it into hits; raise on any shape problem."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        raise RetrievalUnavailableError('response has no "result" list', kind="malformed")
    result = payload["result"]
    if len(result) != n_queries:
        raise RetrievalUnavailableError(
            f"response has {len(result)} result lists for {n_queries} queries", kind="malformed"
        )
    out: list[list[Hit]] = []
    for per_query in result:
        if not isinstance(per_query, list):
            raise RetrievalUnavailableError("a result entry is not a list", kind="malformed")
        try:
            scored = _SCORED_LIST.validate_python(per_query)
        except ValidationError:
            raise RetrievalUnavailableError(
                'a result item is not {"document": {"id", "contents"}, "score"}', kind="malformed"
            ) from None
        out.append(
            [
                Hit(
                    id=s.document.id,
                    contents=s.document.contents,
                    score=s.score,
                    extra=dict(s.document.model_extra or {}),
                )
                for s in scored
            ]
        )
    return out


__all__ = ["Hit", "parse_result"]
