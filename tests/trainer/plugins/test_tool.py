"""SearchTool against live retrieval services: results, failover, failures as observations, token by name."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from searchrl.errors import ConfigError
from tests.conftest import free_port
from tests.live import serve_in_thread
from tests.trainer.conftest import SEVENTH_SEAL_QUESTION

pytestmark = pytest.mark.live


def _tool(urls: list[str], **config: Any):
    from searchrl.trainer.plugins.tool import SearchTool

    fast = {"timeout_s": 2.0, "max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
    return SearchTool({"type": "native", "retrieval_urls": urls, **fast, **config})


def _call(tool, parameters: dict[str, Any], agent_data: Any = None):
    async def go():
        try:
            instance_id, _ = await tool.create(create_kwargs={"question": "q"})
            result = await tool.execute(instance_id, parameters, agent_data=agent_data)
            await tool.release(instance_id)
            return result
        finally:
            await tool.aclose()

    return asyncio.run(go())


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a free port: nothing listens there


def test_search_returns_search_r1_formatted_passages(live_bm25_url):
    response, reward, metrics = _call(_tool([live_bm25_url]), {"query_list": [SEVENTH_SEAL_QUESTION]})
    lines = response.text.splitlines()
    assert len(lines) == 3 and [line[:6] for line in lines] == ["Doc 1 ", "Doc 2 ", "Doc 3 "]
    assert lines[0].startswith("Doc 1 (Title: The Seventh Seal) The Seventh Seal is a 1957 Swedish")
    assert reward == 0.0
    assert metrics["failed"] == 0 and metrics["num_queries"] == 1 and metrics["num_hits"] == 3
    assert metrics["latency_s"] > 0


def test_several_queries_one_block_each_and_caps(live_bm25_url):
    tool = _tool([live_bm25_url], topk=2, passage_max_chars=60, max_chars=400)
    response, _, metrics = _call(tool, {"query_list": ["Seventh Seal Bergman", "Forbidden City emperors"]})
    text = response.text
    assert text.startswith("Query: Seventh Seal Bergman\nDoc 1 (Title: The Seventh Seal)")
    assert "Query: Forbidden City emperors\nDoc 1 (Title: Forbidden City)" in text
    assert metrics["num_hits"] == 4
    assert len(text) <= 400 + 3
    first_doc = text.splitlines()[1]
    assert first_doc.endswith("...") and len(first_doc) < len("Doc 1 (Title: The Seventh Seal) ") + 60 + 4


def test_failover_answers_from_the_second_url(live_bm25_url):
    response, _, metrics = _call(_tool([_dead_url(), live_bm25_url]), {"query_list": ["The Seventh Seal"]})
    assert "Doc 1 (Title: The Seventh Seal)" in response.text
    assert metrics["failed"] == 0


def test_all_urls_dead_is_an_explicit_observation_and_counted():
    agent_data = SimpleNamespace(extra_fields={})
    response, reward, metrics = _call(
        _tool([_dead_url(), _dead_url()]), {"query_list": ["The Seventh Seal"]}, agent_data=agent_data
    )
    assert response.text == "search failed: connect"
    assert reward == 0.0
    assert metrics["failed"] == 1 and metrics["error"] == "connect"
    assert agent_data.extra_fields["search_calls"] == 1 and agent_data.extra_fields["search_failures"] == 1


def test_bad_arguments_tell_the_model_what_to_fix():
    agent_data = SimpleNamespace(
        extra_fields={"search_calls": 1, "search_failures": 0, "search_latency_s": 0.1}
    )
    response, _, metrics = _call(_tool([_dead_url()]), {"query_list": []}, agent_data=agent_data)
    assert response.text.startswith("search failed: bad arguments: ")
    assert "query_list" in response.text
    assert metrics["error"] == "bad_arguments"
    assert agent_data.extra_fields["search_calls"] == 2 and agent_data.extra_fields["search_failures"] == 1


def test_bare_query_string_is_accepted(live_bm25_url):
    response, _, _ = _call(_tool([live_bm25_url]), {"query": "Seventh Seal Bergman"})
    assert response.text.startswith("Doc 1 (Title: The Seventh Seal)")


def test_token_is_read_from_the_named_env_var(bm25_settings, monkeypatch):
    from searchrl.retrieval.serving.app import create_app

    secured = bm25_settings.model_copy(update={"api_key": SecretStr("s3cret-token")})
    with serve_in_thread(create_app(secured)) as url:
        monkeypatch.setenv("MY_RETRIEVAL_TOKEN", "s3cret-token")
        ok, _, _ = _call(_tool([url], api_key_env="MY_RETRIEVAL_TOKEN"), {"query_list": ["Seventh Seal"]})
        assert ok.text.startswith("Doc 1 (Title: The Seventh Seal)")
        monkeypatch.delenv("MY_RETRIEVAL_TOKEN")
        denied, _, metrics = _call(
            _tool([url], api_key_env="MY_RETRIEVAL_TOKEN"), {"query_list": ["Seventh Seal"]}
        )
        assert denied.text == "search failed: http_401" and metrics["failed"] == 1
        assert "s3cret" not in denied.text


def test_construction_is_free_of_io_and_validates_config():
    tool = _tool([_dead_url()])  # nothing listens: constructing must not care
    assert tool._client is None and tool.name == "search"
    with pytest.raises(ConfigError, match="top_k"):
        _tool(["http://127.0.0.1:1"], top_k=3)
    with pytest.raises(ConfigError, match="http"):
        _tool(["127.0.0.1:1"])


@pytest.mark.parametrize("arguments", [["Seventh Seal"], "Seventh Seal", 7, None])
def test_non_object_arguments_are_a_bad_arguments_observation(arguments):
    # verl hands the tool whatever json.loads made of the model's arguments; a list used to raise AttributeError.
    agent_data = SimpleNamespace(extra_fields={})
    response, _, metrics = _call(_tool([_dead_url()]), arguments, agent_data=agent_data)  # type: ignore[arg-type]
    assert response.text.startswith("search failed: bad arguments: arguments must be a JSON object")
    assert metrics["error"] == "bad_arguments"
    assert agent_data.extra_fields["search_failure_kinds"] == "bad_arguments"


def test_observation_fits_the_budget_so_verl_never_truncates_again(live_bm25_url):
    """The tool's cap is verl's max_tool_response_length: an observation cut to it must not grow past it."""
    from searchrl.trainer.settings import TrainSettings

    budget = TrainSettings(topk=3, passage_max_chars=60).max_tool_response_chars
    many = [f"Seventh Seal Bergman {i}" for i in range(12)]  # 12 blocks of 3 passages: far above the budget
    response, _, _ = _call(
        _tool([live_bm25_url], topk=3, passage_max_chars=60, max_chars=budget), {"query_list": many}
    )
    assert budget - 5 < len(response.text) <= budget and response.text.endswith("...")


def test_failure_kinds_accumulate_per_trajectory():
    agent_data = SimpleNamespace(extra_fields={})
    tool = _tool([_dead_url()])
    _call(tool, {"query_list": ["a"]}, agent_data=agent_data)
    _call(_tool([_dead_url()]), {"query_list": []}, agent_data=agent_data)
    assert agent_data.extra_fields["search_failure_kinds"] == "connect,bad_arguments"
    assert agent_data.extra_fields["search_failures"] == 2


def test_client_counters_reach_the_worker_log(live_bm25_url, caplog):
    """Per-URL counters (sent, failed by kind, breaker) in one INFO line per interval: a dead replica shows."""
    tool = _tool([_dead_url(), live_bm25_url], stats_log_interval_s=0)
    with caplog.at_level("INFO", logger="searchrl.trainer.plugins.tool"):
        for _ in range(2):  # least-outstanding ties go round-robin: the dead URL is tried once
            response, _, metrics = _call(tool, {"query_list": [SEVENTH_SEAL_QUESTION]})
            assert metrics["failed"] == 0 and "The Seventh Seal" in response.text
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrieval client:")][-1:]
    assert "2 calls" in line and f"{live_bm25_url}: sent 2 ok 2 failed none breaker closed" in line
    assert "failed connect=1 breaker open x1" in line
