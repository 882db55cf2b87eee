"""Web search after CSE: `google` through Serper or SerpAPI, `google-cse` with its sunset warning, pinned
gl/hl, the benchmark-site blocklist, and page mode (fetch, clean, ~100-word passages) against loopback pages.

Upstreams are tests/retrieval/fake_web.py speaking Serper's and SerpAPI's JSON; pages come from the same
loopback server; the backends are the real ones, built from settings as the service builds them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from searchrl.errors import BackendError, QuotaExceededError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.web import SerpApiBackend, SerperBackend
from searchrl.retrieval.backends.web.page_text import best_passage, page_text
from searchrl.retrieval.serving.app import create_app
from tests.retrieval.fake_web import SERPAPI_KEY, FakeSearchAPIs, serve_fake, web_settings

pytestmark = pytest.mark.live


@pytest.fixture()
def fake() -> Iterator[FakeSearchAPIs]:
    with serve_fake() as apis:
        yield apis


def search(settings: Any, query: str, topk: int = 3) -> list[Any]:
    async def go() -> list[Any]:
        backend = build_backend(settings)
        await backend.start()
        try:
            return (await backend.search([query], topk))[0]
        finally:
            await backend.close()

    return asyncio.run(go())


def test_google_through_serpapi_pins_country_and_language(
    fake: FakeSearchAPIs, caplog: pytest.LogCaptureFixture
) -> None:
    settings = web_settings(fake, "google", google_provider="serpapi", web_gl="de", web_hl="de")
    backend = build_backend(settings)
    assert isinstance(backend, SerpApiBackend) and backend.name == "google"
    caplog.set_level(logging.DEBUG)
    hits = search(settings, "the seventh seal film")
    assert hits[0].document.id == "https://en.wikipedia.org/wiki/The_Seventh_Seal"
    assert hits[0].document.contents.startswith('"The Seventh Seal - Wikipedia"\n')
    [req] = fake.requests
    p = req["params"]
    assert (p["engine"], p["gl"], p["hl"], p["num"], p["api_key"]) == ("google", "de", "de", "8", SERPAPI_KEY)
    assert SERPAPI_KEY not in caplog.text  # the key rides below the client, never in logged URLs


def test_serpapi_errors(fake: FakeSearchAPIs) -> None:
    with pytest.raises(BackendError, match="Invalid API key.*check SERPAPI_API_KEY"):
        search(web_settings(fake, "serpapi", serpapi_api_key="wrong"), "chess")
    fake.plan.append("429-daily")
    with pytest.raises(QuotaExceededError, match="run out of searches"):
        search(web_settings(fake, "serpapi"), "chess")
    assert search(web_settings(fake, "serpapi"), "zzzqqq nothing matches") == []


def test_google_defaults_to_serper_and_get_root_names_the_provider(fake: FakeSearchAPIs) -> None:
    settings = web_settings(fake, "google")
    assert isinstance(build_backend(settings), SerperBackend)
    with TestClient(create_app(settings)) as client:
        info = client.get("/").json()
    assert info["backend"] == "google" and info["provider"] == "serper"
    assert (info["gl"], info["hl"], info["page_mode"]) == ("us", "en", False)


def test_google_cse_warns_that_it_is_closing(fake: FakeSearchAPIs, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    hits = search(web_settings(fake, "google-cse"), "the seventh seal film")
    assert hits
    assert "closed to new customers" in caplog.text and "2027-01-01" in caplog.text
    assert fake.requests[0]["params"]["gl"] == "us" and fake.requests[0]["params"]["hl"] == "en"


def test_blocklist_drops_sites_hosting_benchmark_answers(fake: FakeSearchAPIs) -> None:
    fake.prepend = [
        ("nq_open · Datasets at Hugging Face", "https://huggingface.co/datasets/nq_open", "who directed ..."),
        ("Seventh Seal trivia quiz", "https://www.sporcle.com/games/x/seventh-seal", "Answer: Bergman"),
    ]
    hits = search(web_settings(fake, "serper"), "the seventh seal film", topk=3)
    urls = [h.document.id for h in hits]
    assert len(urls) == 3 and not any("huggingface" in u or "sporcle" in u for u in urls)
    assert urls[0] == "https://en.wikipedia.org/wiki/The_Seventh_Seal"
    open_hits = search(web_settings(fake, "serper", web_blocklist=""), "the seventh seal film", topk=3)
    assert open_hits[0].document.id == "https://huggingface.co/datasets/nq_open"


def test_page_mode_fetches_cleans_and_chunks_result_pages(fake: FakeSearchAPIs) -> None:
    fake.link_pages = True
    # the fake serves its pages on loopback, which page mode refuses unless private addresses are allowed
    settings = web_settings(
        fake, "serper", web_page_mode=True, web_page_words=40, web_page_allow_private=True
    )
    hits = search(settings, "Bergman film knight chess Death", topk=2)
    top = hits[0].document
    title, text = top.contents.split("\n", 1)
    assert title == '"The Seventh Seal - Wikipedia"' and top.id.endswith("/pages/The_Seventh_Seal")
    assert "Bergman" in text and 30 <= len(text.split()) <= 40  # a passage, not a 150-character snippet
    assert "tracking" not in text and "Donate" not in text and "Creative Commons" not in text
    assert "railway timetables" not in text  # the best-matching window, not the first one
    pages = [r for r in fake.requests if r["api"] == "page"]
    assert len(pages) == len(hits)  # one fetch per result
    assert fake.count("serper") == 1  # page fetches do not spend the provider budget


def test_page_mode_keeps_the_snippet_when_a_page_fails(fake: FakeSearchAPIs) -> None:
    fake.prepend = [("Gone", f"{fake.url}/pages/No_Such_Page", "the snippet survives")]
    settings = web_settings(fake, "serper", web_page_mode=True, web_page_allow_private=True)
    hits = search(settings, "seventh seal", topk=1)
    assert hits[0].document.contents == '"Gone"\nthe snippet survives'


def test_page_text_and_best_passage() -> None:
    html = (
        "<html><script>x()</script><nav>Home About</nav><p>Short line.</p>"
        "<p>The Forbidden City was the imperial palace of the Ming and Qing dynasties in Beijing.</p></html>"
    )
    assert (
        page_text(html)
        == "The Forbidden City was the imperial palace of the Ming and Qing dynasties in Beijing."
    )
    words = " ".join(["filler"] * 300 + ["emperors", "Ming", "Qing"] + ["filler"] * 300)
    assert "emperors Ming Qing" in best_passage(words, "Ming Qing emperors", 100)
    assert best_passage("", "q") == ""
