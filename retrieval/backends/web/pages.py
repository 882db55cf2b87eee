"""Fetching result pages for web page mode, with the guard that keeps a search result from reaching inside.

In page mode (`SEARCHRL_RETRIEVAL_WEB_PAGE_MODE=true`) the service fetches whatever URL a search provider
returns, so a result (or an SEO page redirecting) could point it at cloud metadata (169.254.169.254), a
dashboard on loopback or an intranet host, and /retrieve would hand the page to the caller. It could also hand
the service a 400 MiB page, a gzip bomb or a page that drips one byte a second. `PageFetcher.fetch` refuses
or stops each of these, and every refusal is a `PageFetchError` whose `reason` is the metric label:

    refused_scheme   not http/https (also on a redirect hop)
    refused_address  the host is, or resolves to, a non-public address (below)
    redirects        more than `max_redirects` hops
    blocked          a hop's host is on the blocklist (`host_blocked`): a redirect from an allowed result to
                     a site that hosts the benchmarks' answers is refused like the result itself would be
    too_large        Content-Length, or the body decoded so far, above `max_bytes`
    timeout          the whole fetch (queueing, DNS, every redirect hop, the body) took longer than its budget
    error            anything else: connection failure, HTTP status not 2xx, not HTML, bad encoding

Public addresses only. An address is public when `is_public_address` says so: Python's `ipaddress`
`is_global`, minus multicast and reserved ranges (`is_global` lets 224.0.0.0/4 and ff00::/8 through), with the
IPv4 address inside IPv4-mapped (::ffff:a.b.c.d), 6to4 (2002::/16) and NAT64 (64:ff9b::/96) forms checked
as IPv4, and Teredo refused. That refuses loopback, 10/8, 172.16/12, 192.168/16, fc00::/7 (incl. AWS's
fd00:ec2::254), link-local 169.254/16 (incl. 169.254.169.254) and fe80::/10, CGNAT 100.64/10, 0.0.0.0, ::.
`allow_private=True` (SEARCHRL_RETRIEVAL_WEB_PAGE_ALLOW_PRIVATE) turns the address check off for operators
who want intranet pages; the scheme, redirect, size and time limits stay.

How the check holds against DNS rebinding: we resolve the host ourselves (`loop.getaddrinfo`), refuse it if
ANY of its addresses is not public (a host mixing public and private addresses is not a normal web site), and
then connect to that checked IP, never to the name: the request URL carries the IP, the `Host` header carries
the name, and for https httpcore's `sni_hostname` extension sends the name as SNI and verifies the
certificate against it (ssl's `server_hostname`). So no second lookup happens between the check and the
connect. Redirects are followed here, one hop at a time, each hop re-checked the same way; the client has
`follow_redirects=False` and `trust_env=False` (an HTTP(S)_PROXY from the environment would make the proxy
resolve the name, and our check would check nothing).

Bounded bytes: the body is read raw and decoded here (identity, gzip, deflate; we only advertise those)
with zlib's `max_length`, so a bomb inflates at most `max_bytes` + 1 bytes before it is refused; httpx's own
decoders inflate each network chunk whole (one 64 KiB gzip chunk of zeros is ~64 MiB). Bounded concurrency:
at most `max_in_flight` pages are fetched at once per fetcher, so memory stays under max_in_flight x max_bytes.
Bounded time: one `asyncio.timeout` around the whole fetch. HTML is parsed by the caller, off the event loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from searchrl.errors import PageFetchError

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

REASONS = ("refused_address", "refused_scheme", "too_large", "timeout", "error", "redirects", "blocked")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 well-known prefix: the low 32 bits are IPv4
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215 local-use NAT64, not in 3.11's tables
_ACCEPT_ENCODING = "gzip, deflate"


def is_public_address(ip: IPAddress) -> bool:
    """True for an address on the public internet; False for loopback, private, link-local, CGNAT, ..."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.teredo is not None or ip in _NAT64_LOCAL:
            return False
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(embedded)
        if ip.scope_id:
            return False  # a zone index (fe80::1%eth0) only means something on a local link
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_private or ip.is_unspecified)


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def loggable(url: str | httpx.URL) -> str:
    """The URL without its query string, fragment or user info: what may go into a log line."""
    try:
        u = httpx.URL(url)
        return f"{u.scheme}://{u.netloc.decode('ascii', 'replace')}{u.path}"
    except (httpx.InvalidURL, TypeError):
        return "<invalid URL>"


@dataclass(frozen=True)
class Page:
    url: str  # after redirects
    body: bytes  # decoded (no content-encoding), at most max_bytes
    charset: str | None  # from Content-Type, if given


class _Decoder:
    """Undoes Content-Encoding chunk by chunk, never producing more than the caller's `room`."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()  # zlib-wrapped, as the RFC says; raw deflate on the first error
            self._raw_tried = False
        else:
            raise PageFetchError("error", f"unsupported Content-Encoding {encoding!r}")

    def decode(self, data: bytes, room: int) -> bytes:
        if self._z is None:
            return data[:room]
        try:
            return self._z.decompress(data, room)
        except zlib.error as exc:
            if self.encoding == "deflate" and not self._raw_tried:
                self._raw_tried = True
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(data, room)
            raise PageFetchError("error", f"bad {self.encoding} body ({exc})") from None


class PageFetcher:
    """GETs public HTML pages within a byte cap and a time budget; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_bytes: int = 2_000_000,
        allow_private: bool = False,
        max_redirects: int = 5,
        max_in_flight: int = 32,
        user_agent: str = "Mozilla/5.0 (compatible; searchrl-retrieval)",
        resolve: Resolver | None = None,
        address_allowed: Callable[[IPAddress], bool] | None = None,
        host_blocked: Callable[[str], bool] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._host_blocked = host_blocked  # checked on every hop, the first included
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self._resolve = resolve or _getaddrinfo
        self._allowed = address_allowed or ((lambda ip: True) if allow_private else is_public_address)
        self._user_agent = user_agent
        self._max_in_flight = max_in_flight
        self._slots: asyncio.Semaphore | None = None
        self._client: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def fetch(self, url: str, timeout_s: float | None = None) -> Page:
        """The page at `url` (redirects followed and checked); raises `PageFetchError` with a reason."""
        budget = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        if budget <= 0:
            raise PageFetchError("timeout", "no time left in the request's deadline")
        if self._client is None:
            # built in a thread: loading the CA bundle takes 60-90 ms of CPU, which would stall the loop
            client = await asyncio.to_thread(self._new_client)
            if self._client is None:
                self._client, self._slots = client, asyncio.Semaphore(self._max_in_flight)
            else:  # another first fetch got there while this one waited
                await client.aclose()
        assert self._slots is not None
        try:
            # asyncio.timeout, not wait_for: wait_for runs the fetch as a task of its own, and the task holding the
            # exception whose traceback holds wait_for's frame (which holds the task) is a reference cycle, so a
            # refused page's body and response waited for the cyclic GC. With the cycle in _follow, 8 big pages
            # in flight grew RSS by 475 MB in 8 s (`searchrl reliability --only hostile`); without, ~100 MB
            async with asyncio.timeout(budget):
                return await self._queued(url)
        except TimeoutError:
            raise PageFetchError("timeout", f"the page did not arrive within {budget:g}s") from None
        except httpx.TimeoutException:
            raise PageFetchError("timeout", f"the page did not arrive within {budget:g}s") from None
        except httpx.HTTPError as exc:
            raise PageFetchError("error", type(exc).__name__) from None

    def _new_client(self) -> httpx.AsyncClient:
        # A client of its own: page fetches go to arbitrary sites and never carry a provider key.
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s),
            follow_redirects=False,
            trust_env=False,
            # no reuse: a pooled TLS connection to one IP, verified for one name, must not carry another's
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"User-Agent": self._user_agent, "Accept-Encoding": _ACCEPT_ENCODING},
        )

    async def _queued(self, url: str) -> Page:
        assert self._slots is not None
        async with self._slots:
            return await self._follow(url)

    async def _follow(self, url: str) -> Page:
        assert self._client is not None
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL:
            raise PageFetchError("error", "not a valid URL") from None
        for _hop in range(self.max_redirects + 1):
            if self._host_blocked is not None and self._host_blocked(target.host.lower()):
                raise PageFetchError("blocked", f"{target.host} is on the blocklist")
            request = await self._checked_request(target)
            response = await self._client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    try:
                        target = target.join(location)
                    except httpx.InvalidURL:
                        raise PageFetchError("error", "redirect to an invalid URL") from None
                    continue
                return await self._read(str(target), response)
            finally:
                await response.aclose()
                # httpx's Response and its stream refer to each other, a cycle only the cyclic GC frees, and the
                # stream holds the connection with whatever it read ahead (uvloop reads up to 8 MiB per wake-up):
                # drop the link so a refused page's buffers go now, not at a full collection
                response.stream = httpx.ByteStream(b"")
        raise PageFetchError("redirects", f"more than {self.max_redirects} redirects")

    async def _checked_request(self, target: httpx.URL) -> httpx.Request:
        """A GET to the checked IP of `target`'s host, with the name in Host and SNI."""
        assert self._client is not None
        if target.scheme not in ("http", "https"):
            raise PageFetchError("refused_scheme", f"scheme {target.scheme!r} is not http or https")
        host = target.raw_host.decode("ascii")  # IDNA names as punycode, for DNS and SNI alike
        if not host:
            raise PageFetchError("error", "URL without a host")
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = [ipaddress.ip_address(a) for a in await self._resolve(host, port)]
            except (OSError, ValueError) as exc:
                raise PageFetchError("error", f"cannot resolve the host ({type(exc).__name__})") from None
            if not addresses:
                raise PageFetchError("error", "the host has no address")
        refused = [a for a in addresses if not self._allowed(a)]
        if refused:
            raise PageFetchError("refused_address", f"the host is or resolves to non-public {refused[0]}")
        ip = addresses[0]
        pinned = httpx.URL(scheme=target.scheme, host=str(ip), port=target.port, raw_path=target.raw_path)
        return self._client.build_request(
            "GET",
            pinned,
            headers={"Host": target.netloc.decode("ascii")},
            extensions={"sni_hostname": host},
        )

    async def _read(self, url: str, response: httpx.Response) -> Page:
        if not response.is_success:
            raise PageFetchError("error", f"HTTP {response.status_code}")
        content_type = response.headers.get("content-type", "text/html")
        if "html" not in content_type:
            raise PageFetchError("error", f"not HTML ({content_type})")
        cap = self.max_bytes
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise PageFetchError("too_large", f"Content-Length {declared} is above the cap of {cap} bytes")
        decoder = _Decoder(response.headers.get("content-encoding", "").strip().lower())
        body = bytearray()
        raw = 0
        async for chunk in response.aiter_raw():
            raw += len(chunk)
            body += decoder.decode(chunk, cap + 1 - len(body))
            if len(body) > cap or raw > cap:
                raise PageFetchError("too_large", f"the page is above the cap of {cap} bytes")
        return Page(url=url, body=bytes(body), charset=response.charset_encoding)


__all__ = ["REASONS", "Page", "PageFetchError", "PageFetcher", "is_public_address", "loggable"]
