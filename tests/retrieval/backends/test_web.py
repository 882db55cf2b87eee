"""Web backends against a local fake of the provider APIs (real uvicorn on 127.0.0.1, real wire formats)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from searchrl.errors import BackendError, ConfigError, QuotaExceededError
from searchrl.retrieval.backends import build_backend
from searchrl.retrieval.backends.web import DailyBudget, GoogleCSEBackend, SearxngBackend, SerperBackend
from searchrl.retrieval.settings import RetrievalSettings
from tests.retrieval.fake_web import (
    CSE_ID,
    GOOGLE_KEY,
    RECORDED,
    FakeSearchAPIs,
    web_settings,
)


def run_search(settings: RetrievalSettings, queries: list[str], topk: int) -> list[list[Any]]:
    async def go() -> list[list[Any]]:
        backend = build_backend(settings)
        await backend.start()
        try:
            return await backend.search(queries, topk)
        finally:
            await backend.close()

    return asyncio.run(go())


@pytest.mark.live
def test_google_maps_items_to_search_r1_documents(fake: FakeSearchAPIs) -> None:
    [hits] = run_search(web_settings(fake), ["the seventh seal film"], 3)
    assert len(hits) == 3
    top = hits[0].document
    assert top.id == "https://en.wikipedia.org/wiki/The_Seventh_Seal"
    assert top.url == top.id
    assert top.contents.startswith('"The Seventh Seal - Wikipedia"\nThe Seventh Seal is a 1957 Swedish')
    assert top.display_link == "en.wikipedia.org"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    [req] = fake.requests
    assert req["params"]["num"] == "3" and req["params"]["start"] == "1"
    assert req["params"]["key"] == GOOGLE_KEY and req["params"]["cx"] == CSE_ID


@pytest.mark.live
def test_google_recorded_response_is_cleaned_and_deduplicated(fake: FakeSearchAPIs) -> None:
    query = next(iter(RECORDED))
    [hits] = run_search(web_settings(fake), [query], 4)
    urls = [h.document.url for h in hits]
    # four items with one duplicate link: three documents, in Google's order
    assert urls == [
        "https://en.wikipedia.org/wiki/The_Seventh_Seal",
        "https://www.imdb.com/title/tt0050976/",
        "https://www.ingmarbergman.se/en",
    ]
    assert hits[0].document.contents == (
        '"The Seventh Seal - Wikipedia"\nThe Seventh Seal is a 1957 Swedish historical fantasy film written and '
        "directed by Ingmar Bergman. Set in Sweden during the Black Death, ..."
    )
    assert hits[2].document.contents == '"Ingmar Bergman Foundation"\n'  # no snippet in the item


@pytest.mark.live
def test_google_pages_above_ten(fake: FakeSearchAPIs) -> None:
    query = "the of and in"  # matches most of the 20 passages
    expected = [t for t, _ in fake.ranked(query)]
    assert len(expected) > 15
    [hits] = run_search(web_settings(fake), [query], 15)
    assert [h.document.id.rsplit("/", 1)[1].replace("_", " ") for h in hits] == expected[:15]
    pages = [(r["params"]["start"], r["params"]["num"]) for r in fake.requests]
    assert pages == [("1", "10"), ("11", "5")]


@pytest.mark.live
def test_google_stops_paging_when_results_run_out(fake: FakeSearchAPIs) -> None:
    query = "bergman"
    available = len(fake.ranked(query))
    assert 0 < available < 10
    [hits] = run_search(web_settings(fake), [query], 25)
    assert len(hits) == available
    assert fake.count("google") == 1  # no nextPage in the answer: no second request


@pytest.mark.live
def test_google_no_results_is_an_empty_list_not_an_error(fake: FakeSearchAPIs) -> None:
    [hits] = run_search(web_settings(fake), ["zzqxv"], 3)
    assert hits == []
    assert fake.count("google") == 1


@pytest.mark.live
def test_retries_429_and_5xx_then_succeeds(fake: FakeSearchAPIs, caplog: pytest.LogCaptureFixture) -> None:
    fake.plan.extend(["500", "503", "429"])
    with caplog.at_level(logging.WARNING, logger="retrieval"):
        [hits] = run_search(web_settings(fake, web_max_retries=3), ["seventh seal"], 3)
    assert hits and fake.count("google") == 4
    assert caplog.text.count("retrying in") == 3


@pytest.mark.live
def test_retries_spend_the_budget_and_show_in_metrics(fake: FakeSearchAPIs) -> None:
    """Every request sent to the provider spends the daily budget, retries too, and /metrics counts them."""
    from searchrl.retrieval.serving.metrics import RetrievalMetrics

    fake.plan.extend(["500", "503"])
    metrics = RetrievalMetrics()

    async def go() -> dict[str, Any]:
        backend = build_backend(web_settings(fake, web_max_retries=3))
        backend.attach_metrics(metrics)
        await backend.start()
        try:
            await backend.search(["seventh seal"], 3)
            return backend.info()
        finally:
            await backend.close()

    info = asyncio.run(go())
    assert info["requests_today"] == 3  # one search, two retries: three requests billed
    text = metrics.render().decode()
    assert 'searchrl_retrieval_web_upstream_requests_total{attempt="first",provider="google-cse"} 1.0' in text
    assert 'searchrl_retrieval_web_upstream_requests_total{attempt="retry",provider="google-cse"} 2.0' in text


@pytest.mark.live
def test_retries_exhausted_raise_backend_error_with_upstream_message(fake: FakeSearchAPIs) -> None:
    fake.plan.extend(["500"] * 3)
    with pytest.raises(BackendError, match=r"HTTP 500: Backend Error \(after 3 attempts\)"):
        run_search(web_settings(fake, web_max_retries=2), ["seventh seal"], 3)
    assert fake.count("google") == 3


@pytest.mark.live
def test_persistent_rate_limit_is_a_quota_error(fake: FakeSearchAPIs) -> None:
    fake.plan.extend(["429"] * 2)
    with pytest.raises(QuotaExceededError, match="Queries per minute"):
        run_search(web_settings(fake, web_max_retries=1), ["seventh seal"], 3)
    assert fake.count("google") == 2


@pytest.mark.live
def test_daily_quota_429_is_not_retried(fake: FakeSearchAPIs) -> None:
    fake.plan.append("429-daily")
    with pytest.raises(QuotaExceededError, match="daily quota"):
        run_search(web_settings(fake, web_max_retries=3), ["seventh seal"], 3)
    assert fake.count("google") == 1


@pytest.mark.live
def test_timeout_is_retried_then_reported(fake: FakeSearchAPIs) -> None:
    fake.plan.append(("sleep", 1.0))
    [hits] = run_search(web_settings(fake, web_timeout_s=0.2, web_max_retries=1), ["seventh seal"], 3)
    assert hits and fake.count("google") == 2
    fake.reset()
    fake.plan.extend([("sleep", 1.0)] * 2)
    with pytest.raises(BackendError, match=r"timed out after 0.2s \(2 attempts\)"):
        run_search(web_settings(fake, web_timeout_s=0.2, web_max_retries=1), ["seventh seal"], 3)


@pytest.mark.live
def test_daily_budget_refuses_without_calling_upstream(fake: FakeSearchAPIs) -> None:
    async def go() -> None:
        backend = build_backend(web_settings(fake, web_daily_budget=2))
        await backend.start()
        await backend.search(["seventh seal", "black death"], 3)
        assert backend.info()["requests_today"] == 2
        with pytest.raises(QuotaExceededError, match="daily request budget of 2 is spent"):
            await backend.search(["chess"], 3)
        await backend.close()

    asyncio.run(go())
    assert fake.count("google") == 2


@pytest.mark.live
def test_budget_counts_each_page(fake: FakeSearchAPIs) -> None:
    with pytest.raises(QuotaExceededError, match="SEARCHRL_RETRIEVAL_WEB_DAILY_BUDGET"):
        run_search(web_settings(fake, web_daily_budget=1), ["the of and in"], 15)
    assert fake.count("google") == 1


def test_budget_resets_on_the_next_utc_day() -> None:
    now = [1_700_000_000.0]
    budget = DailyBudget(1, clock=lambda: now[0])
    budget.spend("google")
    with pytest.raises(QuotaExceededError):
        budget.spend("google")
    now[0] += 86_400
    budget.spend("google")
    assert budget.snapshot() == {"daily_budget": 1, "requests_today": 1}


@pytest.mark.live
def test_rate_limit_spaces_requests(fake: FakeSearchAPIs) -> None:
    run_search(web_settings(fake, web_rate_limit_rps=20), [f"seventh seal {i}" for i in range(6)], 3)
    times = sorted(r["t"] for r in fake.requests)
    assert len(times) == 6
    assert times[-1] - times[0] >= 5 / 20 * 0.9


@pytest.mark.live
def test_key_never_in_logs_or_errors(fake: FakeSearchAPIs, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # and httpx's own logger: a CLI run earlier in this process (`searchrl reliability` quiets it) must not hide it
    caplog.set_level(logging.DEBUG, logger="httpx")
    errors: list[str] = []
    fake.plan.extend(["500", ("sleep", 1.0)])
    run_search(web_settings(fake, web_timeout_s=0.3, web_max_retries=2), ["seventh seal"], 3)
    for settings, plan in [
        (web_settings(fake, google_api_key="AIzaSy-wrong-key-but-also-secret"), []),
        (web_settings(fake, web_max_retries=0), ["500"]),
        (web_settings(fake, web_max_retries=0, web_timeout_s=0.2), [("sleep", 1.0)]),
        (web_settings(fake, web_daily_budget=1), []),
    ]:
        fake.plan.extend(plan)
        with pytest.raises(BackendError) as info:
            run_search(settings, ["seventh seal", "chess"], 15)
        errors.append(str(info.value))
    assert any("API key not valid" in e and "GOOGLE_API_KEY" in e for e in errors)
    # httpx logged its requests, with the URL but without the key or engine id
    assert "HTTP Request: GET" in caplog.text and "customsearch/v1?q=" in caplog.text
    for secret in (GOOGLE_KEY, "AIzaSy-wrong-key-but-also-secret", CSE_ID):
        assert secret not in caplog.text
        assert all(secret not in e for e in errors)
    backend = build_backend(web_settings(fake))
    assert GOOGLE_KEY not in repr(backend.info()) and CSE_ID not in repr(backend.info())
    assert GOOGLE_KEY not in repr(web_settings(fake))


def test_missing_credentials_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GOOGLE_API_KEY and GOOGLE_CSE_ID"):
        build_backend(RetrievalSettings(backend="google-cse"))
    with pytest.raises(ConfigError, match="SERPER_API_KEY"):
        build_backend(RetrievalSettings(backend="serper"))


@pytest.mark.live
def test_credentials_come_from_the_environment(fake: FakeSearchAPIs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", GOOGLE_KEY)
    monkeypatch.setenv("GOOGLE_CSE_ID", CSE_ID)
    settings = RetrievalSettings(
        backend="google-cse", google_base_url=f"{fake.url}/customsearch/v1", web_rate_limit_rps=0
    )
    assert isinstance(build_backend(settings), GoogleCSEBackend)
    [hits] = run_search(settings, ["the seventh seal"], 2)
    assert len(hits) == 2


@pytest.mark.live
def test_serper_posts_json_with_header_key(fake: FakeSearchAPIs) -> None:
    settings = web_settings(fake, "serper")
    assert isinstance(build_backend(settings), SerperBackend)
    [hits] = run_search(settings, ["the seventh seal film"], 12)
    assert hits[0].document.id == "https://en.wikipedia.org/wiki/The_Seventh_Seal"
    assert len(hits) == 12
    [req] = fake.requests
    # 5 extra results so blocklisted sites can be dropped; country and language pinned
    assert req["params"] == {"q": "the seventh seal film", "num": 17, "gl": "us", "hl": "en"}
    with pytest.raises(BackendError, match="HTTP 403: Unauthorized.; check SERPER_API_KEY"):
        run_search(web_settings(fake, "serper", serper_api_key="wrong"), ["chess"], 3)


@pytest.mark.live
def test_searxng_pages_until_topk(fake: FakeSearchAPIs) -> None:
    settings = web_settings(fake, "searxng")
    assert isinstance(build_backend(settings), SearxngBackend)
    query = "the of and in"
    [hits] = run_search(settings, [query], 15)
    assert [h.document.id.rsplit("/", 1)[1].replace("_", " ") for h in hits] == [
        t for t, _ in fake.ranked(query)
    ][:15]
    assert [r["params"]["pageno"] for r in fake.requests] == ["1", "2"]
    assert all(r["params"]["format"] == "json" for r in fake.requests)


@pytest.mark.live
def test_errors_reach_the_client_as_http_errors(fake: FakeSearchAPIs) -> None:
    """Through the real app: results are 200, upstream failure is 502, spent budget is 429, never []."""
    from searchrl.retrieval.serving.app import create_app

    app = create_app(web_settings(fake, web_max_retries=0, web_daily_budget=3))
    with TestClient(app) as client:
        ok = client.post("/retrieve", json={"queries": ["seventh seal"], "topk": 2, "return_scores": True})
        assert ok.status_code == 200
        assert ok.json()["result"][0][0]["document"]["url"].startswith("https://en.wikipedia.org/wiki/")
        fake.plan.append("500")
        bad = client.post("/retrieve", json={"query": "chess", "topk": 2})
        assert bad.status_code == 502 and "HTTP 500: Backend Error" in bad.json()["detail"]
        client.post("/retrieve", json={"query": "chess", "topk": 2})
        spent = client.post("/retrieve", json={"query": "black death", "topk": 2})
        assert spent.status_code == 429 and "daily request budget of 3" in spent.json()["detail"]
        assert GOOGLE_KEY not in spent.text
