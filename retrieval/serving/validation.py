"""The /retrieve request model with this server's limits as schema constraints, and the one error body.

Why not validators: limits written as pydantic Field constraints appear in the OpenAPI schema, so the schema
states exactly what the server accepts (a schema-driven fuzzer finds no body the schema allows and the server
refuses, or the reverse). `request_model(settings)` builds the model per app because the limits are settings.
`searchrl.retrieval.schemas.RetrieveRequest` stays the unconstrained wire format that clients share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    create_model,
)

from searchrl.retrieval.schemas import RetrieveRequest
from searchrl.retrieval.settings import RetrievalSettings

# "Not blank": at least one character that is not ASCII whitespace. Written as an explicit class because Python's
# re (the fuzzer's generator) and Rust's regex (pydantic-core) disagree on what \s covers.
NOT_BLANK = r"[^ \t\n\r\f\v]"


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of the service: one sentence saying what is wrong and how to fix it."""

    detail: str = Field(description="what is wrong and how to fix it")


class ReadyBody(BaseModel):
    """GET/POST /ready: whether this replica should get traffic, and why not."""

    ready: bool
    detail: str = Field(
        description='"ok" or why not (index loading, worker dead or stalled, queue full, draining)'
    )


def _integral_float_to_int(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer, so the server does too; strings and booleans stay errors."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def request_model(settings: RetrievalSettings) -> type[RetrieveRequest]:
    """A RetrieveRequest subclass whose fields carry this server's limits (shown in OpenAPI, enforced here)."""
    query = Annotated[
        str,
        StringConstraints(strict=True, min_length=1, max_length=settings.max_query_chars, pattern=NOT_BLANK),
    ]
    # Fields are not nullable (the schema says so and the server agrees): omit a field rather than send null.
    fields: dict[str, Any] = {
        "queries": (
            list[query],
            Field(
                default=None,
                min_length=1,
                max_length=settings.max_queries,
                description=f"Search-R1 batch style: 1..{settings.max_queries} queries, each 1..."
                f"{settings.max_query_chars} characters with at least one non-space",
            ),
        ),
        "query": (query, Field(default=None, description="SkyRL single-query style")),
        "topk": (
            Annotated[StrictInt, BeforeValidator(_integral_float_to_int)],
            Field(
                default=None,
                ge=1,
                le=settings.max_topk,
                description=f"results per query, 1..{settings.max_topk}; default {settings.topk}",
            ),
        ),
        "return_scores": (
            StrictBool,
            Field(default=False, description="scored objects instead of bare documents"),
        ),
    }
    model: type[RetrieveRequest] = create_model(
        "RetrieveBody",
        __base__=RetrieveRequest,
        __config__=None,
        **fields,
    )
    model.model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["queries"]}, {"required": ["query"]}]},
    )
    model.model_rebuild(force=True)
    return model


def describe_errors(errors: Sequence[Mapping[str, Any]], settings: RetrievalSettings) -> tuple[int, str]:
    """One readable sentence for the first problem in a request body (400 for bad JSON, else 422)."""
    if not errors:
        return 422, "invalid request"
    err = errors[0]
    kind = err.get("type", "")
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    where = ".".join(loc)
    field = loc[0] if loc else ""
    if kind == "json_invalid":
        return (
            400,
            f"request body is not valid JSON (UTF-8): {err.get('ctx', {}).get('error', err.get('msg'))}",
        )
    if kind == "extra_forbidden":
        return 422, f"unknown field {where!r}; allowed: queries, query, topk, return_scores"
    if kind == "missing" and not loc:
        return 422, 'request body is empty: send {"queries": [...], "topk": 3}'
    if kind in {"model_attributes_type", "dict_type", "model_type"}:
        return 422, 'request body must be a JSON object like {"queries": ["..."], "topk": 3}'
    if field == "topk" and kind == "less_than_equal":
        return 422, f"topk: {err.get('input')} is above this server's maximum of {settings.max_topk}"
    if field == "queries" and len(loc) == 1 and kind == "too_long":
        n = len(err.get("input") or ())
        return 422, f"queries: {n} queries in one request; this server takes at most {settings.max_queries}"
    if field == "queries" and len(loc) == 1 and kind == "too_short":
        return 422, '"queries" is empty: send at least one query'
    if kind == "string_too_long":
        n = len(err.get("input") or "")
        return 422, f"{where}: {n} characters; the maximum is {settings.max_query_chars}"
    if kind in {"string_pattern_mismatch", "string_too_short"}:
        return 422, f"{where}: empty query string (it needs at least one non-space character)"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return 422, f"{where}: {msg}" if where else msg


__all__ = ["NOT_BLANK", "ErrorBody", "ReadyBody", "describe_errors", "request_model"]
