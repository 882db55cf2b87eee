"""Pinned decoding, the weights' identity, stop strings told from EOS, and the last parity leftovers.

The LLM is the scripted OpenAI-compatible server (vLLM's wire format) on a loopback port; retrieval is the live
BM25 service. Servers fill every sampling field a request leaves out from the model's generation_config.json, so
each generation request must carry the neutral values itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from searchrl.cli import main
from searchrl.infer.llm import PINNED_DECODING, ChatRenderer, Completion
from searchrl.infer.sglang import DEFAULT_COMMAND, launch_flags
from searchrl.prompt import parse_tool_calls
from tests.infer.conftest import serve_scripts
from tests.infer.test_agent import MODEL, TRAINED
from tests.infer.test_resume import eval_argv

PINNED = {"repetition_penalty": 1.0, "top_k": -1, "min_p": 0.0}


def _doc(out: Path) -> dict[str, Any]:
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.live
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_every_generation_request_carries_the_pinned_decoding(
    api: str, live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path
) -> None:
    for llm_url, app in serve_scripts({MODEL: TRAINED}):
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, tmp_path, "--api", api)) == 0
        requests = app.state.requests
    assert PINNED_DECODING == PINNED and len(requests) >= 8
    for body in requests:
        assert {k: body[k] for k in PINNED} == PINNED
        assert (body["temperature"], body["top_p"], body["seed"]) == (0.0, 1.0, 0)
    decoding = _doc(tmp_path)["protocol"]["decoding"]
    assert {k: decoding[k] for k in PINNED} == PINNED and decoding["temperature"] == 0.0


@pytest.mark.live
def test_a_server_that_rejects_a_field_loses_only_that_field(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for llm_url, app in serve_scripts({MODEL: TRAINED}):
        app.state.reject_fields = {
            "top_k"
        }  # as OpenAI's API: "Unrecognized request argument supplied: top_k"
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, tmp_path)) == 0
        requests = app.state.requests
    assert "top_k" in requests[0] and all("top_k" not in r for r in requests[1:])
    assert all(r["repetition_penalty"] == 1.0 and r["min_p"] == 0.0 for r in requests)
    doc = _doc(tmp_path)
    assert doc["protocol"]["decoding_dropped_by_server"] == ["top_k"]
    assert doc["summary"]["em"] == pytest.approx(0.6) and doc["summary"]["llm_errors"] == 0
    assert "rejects the sampling field 'top_k'" in caplog.text


@pytest.mark.live
def test_a_new_checkpoint_under_the_same_name_does_not_resume_into_the_old_file(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path
) -> None:
    for llm_url, app in serve_scripts({MODEL: TRAINED}):
        app.state.model_roots = {MODEL: "/ckpt/global_step_100/actor/hf"}  # vLLM/sglang `root`
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, tmp_path)) == 0
        app.state.model_roots = {MODEL: "/ckpt/global_step_200/actor/hf"}
        app.state.requests.clear()
        assert main(eval_argv(llm_url, live_bm25_url, chat_tokenizer_dir, tmp_path)) == 0
        assert app.state.requests  # it ran again instead of resuming the step-100 file
    docs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert len(docs) == 2
    assert {d["protocol"]["model_identity"]["root"] for d in docs} == {
        "/ckpt/global_step_100/actor/hf",
        "/ckpt/global_step_200/actor/hf",
    }


def test_stop_string_is_told_from_eos() -> None:
    # sglang: matched_stop is the string, or the EOS token id; vLLM: stop_reason is the string or None
    at_stop = Completion("<search> q", "stop", matched_stop="</search>", stop_reported=True)
    at_eos = Completion("<search> q", "stop", matched_stop=None, stop_reported=True)
    assert at_stop.stopped_at("</search>") and not at_eos.stopped_at("</search>")
    assert not Completion("<search> q", "length", stop_reported=True).stopped_at("</search>")
    # a server that says nothing: the open tag is the only clue
    assert Completion("<search> q", "stop").stopped_at("</search>")
    assert not Completion("<answer> a </answer>", "stop").stopped_at("</search>")


def test_managed_sglang_flags() -> None:
    assert DEFAULT_COMMAND.split()[0] == sys.executable  # the venv that runs searchrl runs sglang
    flags = launch_flags("Qwen/Qwen2.5-3B-Instruct", ["--tp", "2"], tool_call_parser=True)
    assert flags == [
        "--tp", "2", "--sampling-defaults", "openai", "--enable-deterministic-inference",
        "--tool-call-parser", "qwen",
    ]  # fmt: skip
    # what the user set wins; no parser for completions or non-Qwen models; determinism can be turned off
    assert launch_flags("m", ["--sampling-defaults=model"], deterministic=False) == [
        "--sampling-defaults=model"
    ]
    assert "--tool-call-parser" not in launch_flags("Qwen/Qwen3-8B", [])
    assert "--tool-call-parser" not in launch_flags("meta-llama/Llama-3.1-8B", [], tool_call_parser=True)


def test_local_engine_overrides_the_models_generation_config(tiny_model_dir: Path) -> None:
    """HF generate() takes unset knobs from generation_config.json (Qwen2.5: repetition_penalty 1.05)."""
    from transformers import GenerationConfig

    from searchrl.infer.llm import Sampling
    from searchrl.infer.local import LocalLLM

    llm = LocalLLM.from_pretrained(str(tiny_model_dir), device="cpu")
    llm.model.generation_config = GenerationConfig(repetition_penalty=5.0, top_k=20)
    seen: dict[str, Any] = {}
    generate = llm.model.generate

    def spy(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return generate(**kwargs)

    llm.model.generate = spy  # type: ignore[method-assign]
    out = asyncio.run(llm.complete("<|im_start|>user\nhi<|im_end|>\n", Sampling(max_tokens=3)))
    assert seen["repetition_penalty"] == 1.0 and seen["top_k"] is None and out.stop_reported
    ident = llm.weights_identity()
    assert len(ident["weights_sample_sha256"]) == 16 and ident["weights_files"] == 1


def test_tool_call_parsing_matches_verls_hermes_parser_on_odd_arguments() -> None:
    """String-valued arguments and a call without `arguments`, as verl 0.9.1's HermesToolParser reads them."""
    from verl.experimental.agent_loop.tool_parser import HermesToolParser

    text = (
        '<tool_call>{"name": "search", "arguments": "{\\"query_list\\": [\\"a\\"]}"}</tool_call>'
        '<tool_call>{"name": "search"}</tool_call>'
        '<tool_call>{"name": "search", "arguments": ["b"]}</tool_call>'
    )

    class _Tok:
        def decode(self, ids: list[int]) -> str:
            return text

    _, theirs = asyncio.run(HermesToolParser(_Tok()).extract_tool_calls([1]))
    ours = parse_tool_calls(text)
    # verl keeps the string and the list as they are (its tool then answers "bad arguments") and drops the
    # call without an arguments key
    assert [(c.name, c.arguments) for c in ours.calls] == [(f.name, json.loads(f.arguments)) for f in theirs]
    assert [c.arguments for c in ours.calls] == ['{"query_list": ["a"]}', ["b"]] and len(ours.errors) == 1


def test_no_separator_after_a_length_cut_turn(chat_tokenizer_dir: Path) -> None:
    """verl's QwenContinuousTokenBuilder re-inserts "\\n" only after <|im_end|>: a length-cut turn has none."""
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

    tok = AutoTokenizer.from_pretrained(str(chat_tokenizer_dir))
    renderer = ChatRenderer(tok)
    builder = QwenContinuousTokenBuilder(tok)
    cut = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["x"]}}\n</tool_call> and then'
    for generated, after_close in ((cut, False), (renderer.close_turn(cut), True)):
        context = renderer.tool_turn(["obs"], None, after_close=after_close)
        bare = renderer.tool_turn(["obs"], None, after_close=False)
        merged = builder._merge_context_token_ids(
            tok.encode(generated, add_special_tokens=False), tok.encode(bare, add_special_tokens=False)
        )
        assert merged.token_ids == tok.encode(generated + context, add_special_tokens=False)
