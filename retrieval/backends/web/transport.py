"""How a web provider's secrets travel and how its errors read.

Secrets (the Google key as `key=`, SerpAPI's `api_key=`, Serper's X-API-KEY header) are added below the httpx
client, so the `httpx.Request` httpx logs ("HTTP Request: GET ...") and that our messages could mention never
holds them.
"""

from __future__ import annotations

import json

import httpx
from pydantic import SecretStr


class SecretTransport(httpx.AsyncBaseTransport):
    """Adds secret query parameters and headers to each request on its way to the network.

    Below the client, so the request object httpx logs and attaches to errors never carries the secrets.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        params: dict[str, SecretStr] | None = None,
        headers: dict[str, SecretStr] | None = None,
    ) -> None:
        self._inner = inner
        self._params = params or {}
        self._headers = headers or {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url.copy_merge_params({k: v.get_secret_value() for k, v in self._params.items()})
        headers = request.headers.copy()
        for name, value in self._headers.items():
            headers[name] = value.get_secret_value()
        signed = httpx.Request(
            request.method, url, headers=headers, stream=request.stream, extensions=request.extensions
        )
        return await self._inner.handle_async_request(signed)

    async def aclose(self) -> None:
        await self._inner.aclose()


def upstream_message(response: httpx.Response) -> str:
    """The provider's own error text: Google {"error": {"message"}}, Serper {"message"}, else the body."""
    try:
        body = response.json()
    except ValueError:
        return " ".join(response.text.split())[:300] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return json.dumps(body)[:300]


__all__ = ["SecretTransport", "upstream_message"]
