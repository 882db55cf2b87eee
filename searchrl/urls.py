"""The retrieval URL list: one parser for every reader of RETRIEVAL_SERVICE_URL (standard library only).

`RETRIEVAL_SERVICE_URL` holds one URL or several separated by commas (the client fails over in that order), and it
is read by the trainer's and inference's settings, `searchrl sky train` (the health check and the corpus check before
a launch), the node-side corpus gate (searchrl/corpus_gate.py, run by the system python before any venv, hence the
standard library only) and `searchrl health`. Each used to split it itself, with three normalisations: one kept a
trailing slash that another dropped, so the same setting named two services (`http://h:8000/` + `/retrieve` is
`//retrieve`). Here, once: items stripped, blanks dropped, a trailing slash removed; and the one scheme check with
a message that never shows a credential.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

SCHEMES = ("http://", "https://")


def split_urls(value: str | Iterable[str]) -> list[str]:
    """The URLs in a comma-separated string (or in each string of an iterable, as argv gives them), in order."""
    items = [value] if isinstance(value, str) else list(value)
    return [url.strip().rstrip("/") for item in items for url in item.split(",") if url.strip().rstrip("/")]


def redact_url(url: str) -> str:
    """Drop any user:password@ from a URL so it can be logged."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def scheme_problem(url: str, what: str = "retrieval URL") -> str | None:
    """One line when `url` is not http(s) (credentials redacted), else None."""
    if url.startswith(SCHEMES):
        return None
    return f"{what} {redact_url(url)!r} must start with http:// or https://"


__all__ = ["SCHEMES", "redact_url", "scheme_problem", "split_urls"]
