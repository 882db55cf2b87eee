"""A hostile web on loopback for page mode (issue 26): pages that try to exhaust a fetcher, and a Serper-shaped
search API whose results point at them.

    python -m searchrl.bench.hostile_web --port 8931     # serve it (the reliability benchmark starts it so)

Page mode fetches whatever a search result links to, so the benchmark (`searchrl reliability --only hostile`)
and the page-mode tests (tests/retrieval/backends/test_pages.py) need pages a real attacker could serve. One app,
`page_app()`, serves all of them; the tests run it in a thread, the benchmark in its own process so that its
CPU and memory are not counted against the service it measures.

    GET  /health                   "ok"
    GET  /page?kb=N                an ordinary article (the Seventh Seal paragraph), padded to about N KiB
    GET  /redirect?to=URL          302 to URL
    GET  /loop                     a redirect chain that never ends (302 to /loop?n=n+1)
    GET  /big?mib=N[&declared=1]   N MiB of HTML, streamed without Content-Length (or with it, if declared)
    GET  /bomb?mib=N               a gzip body (Content-Encoding: gzip) that inflates to N MiB (64 by default)
    GET  /drip?every_s=S&n=N       "<html><p>" then one byte every S seconds, N bytes (0.1 s, 100 by default)
    POST /search                   serper.dev's wire format (X-API-KEY header, JSON {"q", "num", ...} ->
                                   {"searchParameters", "organic": [{"title", "link", "snippet", "position"}]})

Search results: a query whose first word names one of `HOSTILE_PAGES` gets that hostile page first and an
ordinary article second; any other query gets the article only. Snippets say which result they belong to
("<kind> snippet"), so a caller can tell a kept snippet from page text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import struct
import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from searchrl.processes import stop_process
from searchrl.retrieval.process import start_ready

MIB = 1 << 20
SERPER_KEY = "hostile-web-serper-key"  # not a secret: the fake only checks that the service sends a key
ARTICLE = (
    "<html><nav>Home</nav><p>The Seventh Seal is a 1957 Swedish film by Ingmar Bergman about a knight "
    "who plays chess with Death during the Black Death.</p></html>"
)
# ~600 bytes of which ~170 are text, about the share of text in a Wikipedia article's HTML
_FILLER = (
    '<div class="mw-content"><p>This paragraph is <a href="/wiki/Filler_text" title="Filler text" '
    'class="mw-redirect">filler</a> about <span class="nowrap">unrelated matters</span> such as weather patterns, '
    "railway timetables and the price of bread in several provincial markets during the nineteenth century."
    '<sup id="cite_ref-1" class="reference"><a href="#cite_note-1">[1]</a></sup></p>'
    '<table class="infobox vcard"><tbody><tr><th scope="row" class="infobox-label">Released</th>'
    '<td class="infobox-data">1957</td></tr></tbody></table><div class="navbox" role="navigation">'
    '<ul><li><a href="/wiki/A" title="A">A</a></li><li><a href="/wiki/B" title="B">B</a></li></ul></div></div>\n'
)

#: kind -> path: the pages of the issue-26 table (and a redirect chain), at the sizes measured there
HOSTILE_PAGES = {
    "big": "/big?mib=400",  # 400 MiB of HTML, no Content-Length: only a streaming cap stops it
    "bomb": "/bomb?mib=1024",  # ~1 MiB on the wire that inflates to 1 GiB
    "drip": "/drip?every_s=1&n=600",  # one byte a second for 10 minutes
    "redirects": "/loop",  # a redirect chain longer than any limit
}


@functools.lru_cache(maxsize=4)
def gzip_bomb(inflated_mib: int) -> bytes:
    """A valid gzip body that inflates to `inflated_mib` MiB of "<p>aaa...</p>" (1 GiB from ~1 MiB).

    Built in well under a second: after a full flush deflate restarts from an empty window, so one 1 MiB block
    compressed once (level 9, ~1:1000) repeats byte for byte; only the CRC needs every inflated byte.
    """
    block = b"<p>" + b"a" * (MIB - 8) + b"</p>\n"
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)  # raw deflate; the gzip framing is added here
    piece = z.compress(block) + z.flush(zlib.Z_FULL_FLUSH)
    tail = z.flush()
    crc = 0
    for _ in range(inflated_mib):
        crc = zlib.crc32(block, crc)
    header = (
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # magic, deflate, no flags, no mtime, max compression
    )
    trailer = struct.pack("<II", crc, (inflated_mib * MIB) & 0xFFFFFFFF)
    return header + piece * inflated_mib + tail + trailer


def article(kb: int = 0) -> str:
    """The ordinary page: the article paragraph, then filler (text about a quarter of it) up to about `kb` KiB."""
    pad = _FILLER * max(0, kb * 1024 // len(_FILLER))
    return ARTICLE.replace("</html>", pad + "</html>")


def organic(base: str, query: str) -> list[dict[str, object]]:
    """Serper `organic` results for `query`: the hostile page its first word names (if any), then the article."""
    kind = (query.split() or [""])[0]
    results: list[dict[str, object]] = []
    if kind in HOSTILE_PAGES:
        results.append(
            {"title": f"Hostile {kind}", "link": base + HOSTILE_PAGES[kind], "snippet": f"{kind} snippet"}
        )
    n = zlib.crc32(query.encode())  # a distinct URL per query, as real results have
    results.append(
        {"title": "The Seventh Seal", "link": f"{base}/page?kb=200&n={n}", "snippet": "ordinary snippet"}
    )
    return [{**r, "position": i} for i, r in enumerate(results, start=1)]


def page_app() -> Starlette:
    """The hostile pages and the Serper-shaped search API, on one Starlette app (see the module docstring)."""

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def page(request: Request) -> Response:
        return Response(article(int(request.query_params.get("kb", "0"))), media_type="text/html")

    async def redirect(request: Request) -> Response:
        return RedirectResponse(request.query_params["to"], status_code=302)

    async def loop(request: Request) -> Response:
        n = int(request.query_params.get("n", "0"))
        return RedirectResponse(f"/loop?n={n + 1}", status_code=302)

    async def big(request: Request) -> Response:
        mib = int(request.query_params["mib"])
        chunk = (b"<p>" + b"word " * 200 + b"</p>\n") * 100

        async def body() -> AsyncIterator[bytes]:
            sent = 0
            while sent < mib * MIB:
                yield chunk
                sent += len(chunk)

        headers = {"content-length": str(mib * MIB)} if "declared" in request.query_params else None
        return StreamingResponse(body(), media_type="text/html", headers=headers)

    async def bomb(request: Request) -> Response:
        body = gzip_bomb(int(request.query_params.get("mib", "64")))
        return Response(body, media_type="text/html", headers={"content-encoding": "gzip"})

    async def drip(request: Request) -> Response:
        every_s = float(request.query_params.get("every_s", "0.1"))
        n = int(request.query_params.get("n", "100"))  # bounded, so a broken client cannot hold it forever

        async def body() -> AsyncIterator[bytes]:
            yield b"<html><p>"
            for _ in range(n):
                await asyncio.sleep(every_s)
                yield b"a"

        return StreamingResponse(body(), media_type="text/html")

    async def search(request: Request) -> Response:
        if not request.headers.get("x-api-key"):
            return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
        body = await request.json()
        base = str(request.base_url).rstrip("/")
        params = {"q": body["q"], "gl": body.get("gl", "us"), "hl": body.get("hl", "en"), "type": "search"}
        results = organic(base, body["q"])[: int(body.get("num", 10))]
        return JSONResponse({"searchParameters": params, "organic": results, "credits": 1})

    routes = [
        Route("/health", health),
        Route("/page", page),
        Route("/redirect", redirect),
        Route("/loop", loop),
        Route("/big", big),
        Route("/bomb", bomb),
        Route("/drip", drip),
        Route("/search", search, methods=["POST"]),
    ]
    return Starlette(routes=routes)


@contextlib.contextmanager
def serve_hostile_web(port: int, log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Run the hostile web in its own process on 127.0.0.1:`port`; yield its base URL; stop it on exit."""
    cmd = [sys.executable, "-m", "searchrl.bench.hostile_web", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    proc = start_ready(cmd, url, log_path, append=True, timeout_s=timeout_s, interval_s=0.05)
    try:
        yield url
    finally:
        stop_process(proc, grace_s=10)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description="Serve the hostile web (searchrl.bench.hostile_web) on loopback.")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    for path in HOSTILE_PAGES.values():  # build the bombs before answering /health, not on the first request
        if path.startswith("/bomb?mib="):
            gzip_bomb(int(path.rsplit("=", 1)[1]))
    uvicorn.run(page_app(), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


__all__ = [
    "ARTICLE",
    "HOSTILE_PAGES",
    "MIB",
    "SERPER_KEY",
    "article",
    "gzip_bomb",
    "organic",
    "page_app",
    "serve_hostile_web",
]

if __name__ == "__main__":
    raise SystemExit(main())
