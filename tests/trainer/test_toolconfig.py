"""The tool YAML: what verl's own loader builds from it, and what it must never contain."""

from __future__ import annotations

import copy

import pytest
import yaml

from searchrl.errors import ConfigError
from searchrl.prompt import SEARCH_TOOL_SCHEMA
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.toolconfig import TOOL_CLASS, write_tool_config


def test_verl_loads_our_tool_from_the_written_yaml(tmp_path, monkeypatch):
    from verl.tools.tool_registry import load_all_tools

    monkeypatch.setenv("RETRIEVAL_API_KEY", "tok-123-secret")
    settings = TrainSettings(
        data_dir=tmp_path, retrieval_urls="http://10.0.0.1:8000,http://10.0.0.2:8000", topk=5
    )
    path = write_tool_config(settings)
    assert path == (tmp_path / "search_tool.yaml").resolve()

    text = path.read_text()
    assert "tok-123-secret" not in text  # the token is named, never written
    doc = yaml.safe_load(text)
    (entry,) = doc["tools"]
    assert entry["class_name"] == TOOL_CLASS
    assert entry["config"]["api_key_env"] == "RETRIEVAL_API_KEY"
    assert entry["config"]["retrieval_urls"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert entry["tool_schema"] == SEARCH_TOOL_SCHEMA  # the schema the prompt teaches

    (tool,) = load_all_tools(str(path), None)  # no network: construction must not connect anywhere
    assert type(tool).__name__ == "SearchTool" and tool.name == "search"
    assert tool.settings.topk == 5
    assert tool.settings.max_chars == settings.max_tool_response_chars
    # What the chat template will render: verl's property schema keeps type/description/enum only, so the
    # array's "items" is dropped (the prompt's example shows the list of strings instead).
    expected = copy.deepcopy(SEARCH_TOOL_SCHEMA)
    del expected["function"]["parameters"]["properties"]["query_list"]["items"]
    assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == expected
    assert tool._client is None


def test_misspelled_key_in_the_yaml_fails_when_verl_builds_the_tool(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    path = write_tool_config(TrainSettings(data_dir=tmp_path))
    doc = yaml.safe_load(path.read_text())
    doc["tools"][0]["config"]["top_k"] = doc["tools"][0]["config"].pop("topk")
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="top_k"):
        load_all_tools(str(path), None)


def test_explicit_output_path(tmp_path):
    out = write_tool_config(TrainSettings(data_dir=tmp_path / "d"), tmp_path / "x" / "tools.yaml")
    assert out == (tmp_path / "x" / "tools.yaml").resolve() and out.is_file()
    assert not list((tmp_path / "x").glob("*.tmp"))


def test_the_clients_defaults_and_the_topk_bound_have_one_source(tmp_path):
    """The tool YAML's, the trainer settings' and RetrievalClient's defaults are retrieval/client.py's constants, and
    every topk knob stops at searchrl/rollout.py MAX_TOPK, the service's default max_topk (issue 54 item 5)."""
    import inspect

    from pydantic import ValidationError

    from searchrl.infer.settings import InferSettings
    from searchrl.retrieval import client
    from searchrl.retrieval.settings import RetrievalSettings
    from searchrl.rollout import MAX_TOPK, RolloutSpec
    from searchrl.trainer.settings import TrainSettings
    from searchrl.trainer.toolconfig import SearchToolConfig

    tool = SearchToolConfig(retrieval_urls=["http://x"])
    train = TrainSettings(data_dir=tmp_path)
    ctor = inspect.signature(client.RetrievalClient).parameters
    for name in ("timeout_s", "connect_timeout_s", "pool_timeout_s", "max_retries"):
        const = getattr(client, name.upper())
        assert getattr(tool, name) == getattr(train, f"retrieval_{name}") == ctor[name].default == const, name
    assert (tool.backoff_base_s, tool.backoff_max_s) == (client.BACKOFF_BASE_S, client.BACKOFF_MAX_S)
    assert RetrievalSettings().max_topk == MAX_TOPK
    for build in (
        lambda k: SearchToolConfig(retrieval_urls=["http://x"], topk=k),
        lambda k: TrainSettings(data_dir=tmp_path, topk=k),
        lambda k: InferSettings(topk=k),
        lambda k: RolloutSpec(topk=k),
    ):
        assert build(MAX_TOPK).topk == MAX_TOPK
        with pytest.raises(ValidationError):
            build(MAX_TOPK + 1)
