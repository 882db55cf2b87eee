"""Data prep: Search-R1 QA -> verl parquet, read back by verl's own RLHFDataset."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from searchrl.errors import DataError
from searchrl.prompt import build_messages, parse_tool_calls
from searchrl.trainer.data import load_qa, prepare_data, read_split, to_verl_row, train_questions
from searchrl.trainer.settings import TrainSettings


def _settings(tmp_path: Path, source: Path | str, **kw) -> TrainSettings:
    return TrainSettings(qa_source=str(source), data_dir=tmp_path / "out", **kw)


def _synthetic_qa(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            row = {"question": f"question number {i}", "golden_answers": [f"answer {i}"], "data_source": "nq"}
            f.write(json.dumps(row) + "\n")
    return path


def test_fixture_rows_become_verl_rows(tmp_path, qa_sample):
    result = prepare_data(_settings(tmp_path, qa_sample, dataset_size="small"))
    # 25 rows: a seeded sixth (4) held out as test; the train rest (21) loses the row without answers.
    assert (result.train_rows, result.test_rows) == (20, 4)
    rows = pd.concat([pd.read_parquet(result.train_file), pd.read_parquet(result.test_file)])
    assert len(rows) == 24
    assert set(rows["agent_name"]) == {"searchrl_tool_agent"}
    assert {"searchR1_nq", "searchR1_hotpotqa", "searchR1_mywiki"} <= set(rows["data_source"])
    assert all(s.startswith("searchR1_") for s in rows["data_source"])
    first = rows.iloc[0]
    question = first["extra_info"]["question"]
    assert list(first["prompt"]) == build_messages(question)
    assert list(first["reward_model"]["ground_truth"]["target"])
    create_kwargs = first["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]
    assert create_kwargs["question"] == question and create_kwargs["data_source"] == first["data_source"]
    assert sorted(pd.read_parquet(result.train_file)["extra_info"].map(lambda e: e["index"])) == list(
        range(20)
    )


def test_the_split_reads_back_as_written_in_file_order(tmp_path, qa_sample):
    """The one reader the proofs use: each row's question, golden answers and prompt, in the order verl indexes."""
    settings = _settings(tmp_path, qa_sample, dataset_size="small")
    result = prepare_data(settings)
    for path in (result.train_file, result.test_file):
        frame = pd.read_parquet(path)
        rows = read_split(path)
        assert [r.question for r in rows] == [e["question"] for e in frame["extra_info"]]
        assert [r.answers for r in rows] == [
            list(g["target"]) for g in frame["reward_model"].map(lambda m: m["ground_truth"])
        ]
        assert all(r.prompt == build_messages(r.question) and r.answers for r in rows)
    assert train_questions(settings) == [r.question for r in read_split(result.train_file)]
    assert len(train_questions(settings)) == result.train_rows


def test_prompt_teaches_the_format_verls_hermes_parser_reads(offline_tokenizer):
    import asyncio

    from verl.experimental.agent_loop.tool_parser import ToolParser

    prompt = build_messages("Who directed The Seventh Seal?")[0]["content"]
    start, end = prompt.index("<tool_call>"), prompt.index("</tool_call>") + len("</tool_call>")
    example = prompt[start:end]
    assert parse_tool_calls(example).calls[0].arguments == {"query_list": ["your query"]}
    parser = ToolParser.get_tool_parser("hermes", offline_tokenizer)
    ids = offline_tokenizer.encode(example, add_special_tokens=False)
    _, calls = asyncio.run(parser.extract_tool_calls(ids))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"query_list": ["your query"]})]
    assert "<answer>" in prompt and "</answer>" in prompt


def test_sizes_are_seeded_and_reproducible(tmp_path):
    source = _synthetic_qa(tmp_path / "qa.jsonl", 1300)
    a = prepare_data(TrainSettings(qa_source=str(source), data_dir=tmp_path / "a", dataset_size="small"))
    b = prepare_data(TrainSettings(qa_source=str(source), data_dir=tmp_path / "b", dataset_size="small"))
    c = prepare_data(
        TrainSettings(qa_source=str(source), data_dir=tmp_path / "c", dataset_size="small", seed=7)
    )
    assert (a.train_rows, a.test_rows) == (1000, 200)
    assert pd.read_parquet(a.train_file).equals(pd.read_parquet(b.train_file))
    assert pd.read_parquet(a.test_file).equals(pd.read_parquet(b.test_file))
    assert not pd.read_parquet(a.train_file).equals(pd.read_parquet(c.train_file))
    train_q = set(pd.read_parquet(a.train_file)["extra_info"].map(lambda e: e["question"]))
    test_q = set(pd.read_parquet(a.test_file)["extra_info"].map(lambda e: e["question"]))
    assert not train_q & test_q  # held-out split never leaks into training


def test_matching_output_is_reused_and_changed_inputs_rewrite(tmp_path, qa_sample):
    settings = _settings(tmp_path, qa_sample, dataset_size="small")
    assert not prepare_data(settings).reused
    assert prepare_data(settings).reused
    assert not prepare_data(settings, force=True).reused
    assert not prepare_data(_settings(tmp_path, qa_sample, dataset_size="small", seed=1)).reused


def test_hf_download_path(tmp_path, monkeypatch):
    """The real path: hf_hub_download of PeterJinGo/nq_hotpotqa_train, served here from local parquet."""
    import huggingface_hub

    hub = tmp_path / "hub"
    hub.mkdir()
    for split, n in (("train", 30), ("test", 12)):
        pd.DataFrame(
            {
                "id": [f"{split}_{i}" for i in range(n)],
                "question": [f"{split} question {i}" for i in range(n)],
                "golden_answers": [[f"a{i}", f"b{i}"] for i in range(n)],
                "data_source": ["nq" if i % 2 else "hotpotqa" for i in range(n)],
                "ability": ["fact-reasoning"] * n,  # extra upstream columns are ignored
            }
        ).to_parquet(hub / f"{split}.parquet")
    calls = []

    def fake_download(*, repo_id, filename, repo_type, **kw):
        calls.append((repo_id, filename, repo_type))
        return str(hub / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    result = prepare_data(TrainSettings(data_dir=tmp_path / "out", dataset_size="full"))
    assert calls == [
        ("PeterJinGo/nq_hotpotqa_train", "train.parquet", "dataset"),
        ("PeterJinGo/nq_hotpotqa_train", "test.parquet", "dataset"),
    ]
    assert (result.train_rows, result.test_rows) == (30, 12)
    assert result.train_file == tmp_path / "out" / "full" / "train.parquet"
    test = pd.read_parquet(result.test_file)
    assert set(test["data_source"]) == {"searchR1_nq", "searchR1_hotpotqa"}
    assert list(test.iloc[0]["reward_model"]["ground_truth"]["target"]) == ["a0", "b0"]


def test_folder_source_with_splits(tmp_path):
    folder = tmp_path / "qa"
    folder.mkdir()
    _synthetic_qa(folder / "train.jsonl", 9)
    _synthetic_qa(folder / "test.jsonl", 3)
    train, test = load_qa(str(folder), seed=0)
    assert (len(train), len(test)) == (9, 3)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: p.joinpath("x.jsonl").write_text('{"question": "q"}\n{"question": "r"}\n'),
            "lacks column",
        ),
        (lambda p: p.joinpath("x.jsonl").write_text("not json\n"), "cannot read"),
        (lambda p: p.joinpath("x.csv").write_text("question\nq\n"), ".parquet, .jsonl"),
    ],
)
def test_bad_local_files_are_data_errors(tmp_path, make, message):
    make(tmp_path)
    (path,) = [p for p in tmp_path.iterdir() if p.is_file()]
    with pytest.raises(DataError, match=message):
        load_qa(str(path), seed=0)


def test_unknown_source_and_all_bad_rows(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_qa("data/qa.jsonl", seed=0)  # looks like owner/name, but it is a missing file
    with pytest.raises(DataError, match="neither a file"):
        load_qa("./no/such/folder", seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(
            json.dumps({"question": "q", "golden_answers": [], "data_source": "nq"}) + "\n" for _ in range(12)
        )
    )
    with pytest.raises(DataError, match="no usable train rows"):
        prepare_data(_settings(tmp_path, bad))


def test_to_verl_row_rejects_incomplete_records():
    with pytest.raises(ValueError, match="data_source"):
        to_verl_row({"question": "q", "golden_answers": ["a"]}, split="train", index=0)
    with pytest.raises(ValueError, match="question"):
        to_verl_row(
            {"question": float("nan"), "golden_answers": ["a"], "data_source": "nq"}, split="train", index=0
        )


def test_verl_rlhf_dataset_reads_what_the_loop_needs(tmp_path, qa_sample, offline_tokenizer, compose):
    from omegaconf import open_dict
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from searchrl.trainer.overrides import render_overrides
    from searchrl.trainer.toolconfig import write_tool_config

    # a batch the 20 fixture rows fill: render_overrides refuses a schedule verl would cut short
    settings = _settings(
        tmp_path,
        qa_sample,
        dataset_size="small",
        retrieval_urls="http://127.0.0.1:9",
        train_batch_size=8,
        gpus_per_node=1,
    )
    prepared = prepare_data(settings)
    write_tool_config(settings)  # RLHFDataset builds our tool to count tool-schema tokens: no network allowed
    cfg = compose(render_overrides(settings))
    data_cfg = cfg.data.copy()
    with open_dict(data_cfg):
        data_cfg.cache_dir = str(tmp_path / "verl-cache")
    dataset = RLHFDataset(str(prepared.train_file), offline_tokenizer, data_cfg)

    assert dataset.tool_schemas and dataset.tool_schemas[0]["function"]["name"] == "search"
    assert len(dataset) == prepared.train_rows  # nothing filtered as over-long with the tool schema rendered
    row = dataset[0]
    question = row["extra_info"]["question"]
    assert row["raw_prompt"] == build_messages(question)
    assert row["agent_name"] == "searchrl_tool_agent"
    assert row["data_source"].startswith("searchR1_")
    assert row["tools_kwargs"] == {
        "search": {"create_kwargs": {"question": question, "data_source": row["data_source"]}}
    }
    assert row["index"] == row["extra_info"]["index"]
    assert list(row["reward_model"]["ground_truth"]["target"])

    batch = collate_fn([dataset[i] for i in range(4)])
    assert list(batch["agent_name"]) == ["searchrl_tool_agent"] * 4
    assert batch["raw_prompt"].shape == (4,)
