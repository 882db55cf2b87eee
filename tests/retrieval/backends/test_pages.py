"""Page mode's guard (retrieval/backends/web/pages.py): public addresses only on every hop, a byte cap on decoded bytes,
one time budget per page, parsing off the event loop, failures counted by reason in /metrics.

Refusals of literal and resolved addresses open no socket. The live tests serve pages from a loopback server
(searchrl.bench.hostile_web, the one the reliability benchmark uses, in tests.live.serve_in_thread); where a
test needs that server to stand for a public host it passes `address_allowed` admitting exactly 127.0.0.1, so
what is tested is the hop-by-hop re-check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from searchrl.bench.hostile_web import MIB, page_app
from searchrl.retrieval.backends.web.page_text import page_text
from searchrl.retrieval.backends.web.pages import PageFetcher, PageFetchError, is_public_address, loggable
from searchrl.retrieval.serving.app import create_app
from tests.live import serve_in_thread
from tests.retrieval.fake_web import serve_fake, web_settings

LOOPBACK_ONLY = {ipaddress.ip_address("127.0.0.1")}  # the test server standing in for a public host


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    with serve_in_thread(page_app()) as url:
        yield url


def fetch(url: str, **kw: Any) -> tuple[Any, float]:
    """(the Page, or the PageFetchError raised) and the seconds it took."""

    async def go() -> Any:
        fetcher = PageFetcher(**kw)
        try:
            return await fetcher.fetch(url)
        except PageFetchError as exc:
            return exc
        finally:
            await fetcher.aclose()

    started = time.monotonic()
    result = asyncio.run(go())
    return result, time.monotonic() - started


def reason(url: str, **kw: Any) -> str:
    result, _ = fetch(url, **kw)
    return result.reason if isinstance(result, PageFetchError) else "fetched"


# --- addresses (no sockets) ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.251",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "fe80::1",
        "fe80::1%2",
        "fd00:ec2::254",
        "fc00::1",
        "ff02::1",
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "::7f00:1",  # IPv4-compatible (deprecated)
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.215.14", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://[::1]:8080/admin",
        "http://[::ffff:127.0.0.1]/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/iam/",
        "https://10.1.2.3/",
        "http://localhost:9/",  # a name resolving to loopback (real resolver, /etc/hosts)
    ],
)
def test_literal_and_local_hosts_are_refused_before_connecting(url: str) -> None:
    assert reason(url) == "refused_address"


def test_a_name_resolving_to_loopback_is_refused() -> None:
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["93.184.215.14", "127.0.0.1"]  # one private address among public ones is enough

    assert reason("http://rebind.example/x?token=1", resolve=resolve) == "refused_address"
    assert asked == ["rebind.example"]


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "gopher://example.com/"])
def test_other_schemes_are_refused(url: str) -> None:
    assert reason(url) == "refused_scheme"


@pytest.mark.parametrize(
    "html",
    [
        "<div><p>one two three four five six seven eight</p>tail words here one two three four five six</div>",
        "<p>a <a href='x'>link</a> inside eight or more words here</p><br>after the break one two three four",
        "<body><nav>Home</nav><article>Body text one two three four five six seven</article></body>",
        "<p>caf&eacute; &amp; bar &lt;tag&gt; one two three four five six seven</p>",
        "<p>unclosed <b>bold one two three four five six seven eight",
        "",
    ],
)
def test_selectolax_and_html_parser_give_the_same_text(html: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("selectolax")
    fast = page_text(html)
    monkeypatch.setitem(sys.modules, "selectolax.lexbor", None)  # the fallback when the extra is missing
    assert page_text(html) == fast


def test_logged_urls_drop_the_query_string() -> None:
    assert loggable("https://u:pw@example.com:8443/a/b?token=s3cret#frag") == "https://example.com:8443/a/b"


# --- live: a loopback page server ------------------------------------------------------------------------
@pytest.mark.live
def test_loopback_page_is_refused_unless_private_is_allowed(pages: str) -> None:
    assert reason(f"{pages}/page") == "refused_address"
    page, _ = fetch(f"{pages}/page", allow_private=True)
    assert b"Seventh Seal" in page.body


@pytest.mark.live
def test_every_redirect_hop_is_checked(pages: str) -> None:
    allowed = {"address_allowed": lambda ip: ip in LOOPBACK_ONLY}
    assert reason(f"{pages}/redirect?to=/page", **allowed) == "fetched"
    for target in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/admin",
        "http://[fd00:ec2::254]/",
        f"{pages}/redirect?to=http://10.0.0.1/",  # two hops, the second one private
    ]:
        assert reason(f"{pages}/redirect?to={target}", **allowed) == "refused_address", target
    assert reason(f"{pages}/redirect?to=file:///etc/passwd", **allowed) == "refused_scheme"
    assert reason(f"{pages}/loop", **allowed, max_redirects=5) == "redirects"


@pytest.mark.live
def test_the_blocklist_is_checked_on_every_redirect_hop(pages: str) -> None:
    """An allowed result that redirects to a site hosting the answers is refused like that site's own result."""
    from pydantic import SecretStr

    from searchrl.retrieval.backends import build_backend
    from searchrl.retrieval.settings import RetrievalSettings

    settings = RetrievalSettings(backend="serper", serper_api_key=SecretStr("k"), web_page_mode=True)
    backend: Any = build_backend(settings)
    host_blocked = backend._pages._host_blocked  # the backend's own blocklist, defaults extended (issue 23)
    port = httpx.URL(pages).port

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]  # every name stands for the loopback page server

    kw = {"address_allowed": lambda ip: ip in LOOPBACK_ONLY, "resolve": resolve, "host_blocked": host_blocked}
    assert reason(f"http://allowed.example:{port}/redirect?to=/page", **kw) == "fetched"
    for host in ["raw.githubusercontent.com", "www.quora.com", "hf-mirror.com", "brainly.com", "gitee.com"]:
        target = f"http://{host}:{port}/page"
        assert reason(f"http://allowed.example:{port}/redirect?to={target}", **kw) == "blocked", host
        # two hops: the second one lands on the blocklist
        two = f"http://allowed.example:{port}/redirect?to=http://other.example:{port}/redirect?to={target}"
        assert reason(two, **kw) == "blocked", host


def _rss_growth(url: str, **kw: Any) -> tuple[Any, int]:
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = before
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result, _ = fetch(url, allow_private=True, **kw)
    finally:
        done.set()
        watcher.join()
    return result, peak - before


@pytest.mark.live
def test_big_page_stops_at_the_cap(pages: str) -> None:
    result, growth = _rss_growth(f"{pages}/big?mib=50", max_bytes=MIB)
    assert isinstance(result, PageFetchError) and result.reason == "too_large"
    assert growth < 20 * MIB, growth / MIB  # not the 50 MiB page
    assert reason(f"{pages}/big?mib=50&declared=1", allow_private=True, max_bytes=MIB) == "too_large"
    page, _ = fetch(f"{pages}/big?mib=1", allow_private=True, max_bytes=2 * MIB)
    assert len(page.body) >= MIB  # under the cap: read whole


@pytest.mark.live
def test_gzip_bomb_stops_at_the_cap(pages: str) -> None:
    result, growth = _rss_growth(f"{pages}/bomb", max_bytes=MIB)
    assert isinstance(result, PageFetchError) and result.reason == "too_large"
    assert growth < 20 * MIB, growth / MIB  # not the 64 MiB it inflates to
    page, _ = fetch(f"{pages}/bomb?mib=2", allow_private=True, max_bytes=3 * MIB)
    assert len(page.body) == 2 * MIB and page.body.startswith(b"<p>aaa")  # decoded, under the cap


@pytest.mark.live
def test_slow_drip_is_stopped_at_the_page_deadline(pages: str) -> None:
    result, took = fetch(f"{pages}/drip", allow_private=True, timeout_s=1.0)
    assert isinstance(result, PageFetchError) and result.reason == "timeout"
    assert 0.9 < took < 2.0


@pytest.mark.live
def test_health_answers_while_pages_are_fetched_and_parsed(pages: str) -> None:
    """The service (Serper fake upstream, page mode) fetches a ~6 MiB page and a dripping one for a query,
    while /health is polled: it must answer within 250 ms throughout. The snippets survive; /metrics counts."""
    with serve_fake() as fake:
        fake.prepend = [
            ("Big", f"{pages}/big?mib=6", "big snippet"),
            ("Drip", f"{pages}/drip", "drip snippet"),
            ("Ftp", "ftp://example.com/file.html", "ftp snippet"),  # refused without connecting
        ]
        settings = web_settings(
            fake,
            "serper",
            web_page_mode=True,
            web_page_allow_private=True,
            web_page_max_bytes=8 * MIB,
            web_page_timeout_s=1.5,
        )
        app = create_app(settings)
        with serve_in_thread(app) as service:
            answer: dict[str, Any] = {}

            def retrieve() -> None:
                r = httpx.post(
                    f"{service}/retrieve", json={"queries": ["seventh seal"], "topk": 3}, timeout=30
                )
                answer["json"] = r.json()

            worker = threading.Thread(target=retrieve)
            latencies: list[float] = []
            with httpx.Client(base_url=service, timeout=5) as client:  # one client: no TLS set-up per poll
                worker.start()
                while worker.is_alive():
                    started = time.perf_counter()
                    assert client.get("/health").status_code == 200
                    latencies.append(time.perf_counter() - started)
                    time.sleep(0.02)
                worker.join()
                metrics = client.get("/metrics").text
    # Parsing runs in worker threads that share the GIL with the event loop (and, here, with this test's own
    # client and page server): on a busy 2-core box a single probe can pass 250 ms. What the fetcher must never do
    # is block the loop (before: 3.5-7.6 s stalls on one page), so: 9 in 10 probes under 250 ms, none over 2 s (a
    # CI rehearsal at load 14 saw one probe of 1.33 s with every other under 125 ms).
    ordered = sorted(latencies)
    assert len(ordered) > 10 and ordered[int(0.9 * len(ordered))] < 0.25 and ordered[-1] < 2.0, ordered[-5:]
    docs = [hit["contents"] if isinstance(hit, dict) else hit for hit in answer["json"]["result"][0]]
    text = str(docs)
    assert "drip snippet" in text  # the dripping page timed out and kept its snippet
    assert "ftp snippet" in text
    assert 'searchrl_retrieval_web_page_failures_total{reason="timeout"} 1.0' in metrics
    assert 'searchrl_retrieval_web_page_failures_total{reason="refused_scheme"} 1.0' in metrics
