"""A chat template that ignores tools= is refused before a run; the repo's ChatML/hermes template is the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.chat_template import CHATML_HERMES_TEMPLATE, drops_tools, prepare_chat_template
from searchrl.cli import main
from searchrl.errors import ConfigError
from searchrl.infer.llm import ChatRenderer, load_tokenizer
from searchrl.prompt import build_messages
from searchrl.rollout import training_tool_schemas
from tests.conftest import TINY_QA

REFUSAL = (
    "the chat template of {model} ignores tools= (the prompt renders identical with and without the search tool "
    "schema), so the model would never see the tool; pass --chat-template searchrl (the repo's ChatML/hermes "
    "tool template) or --prompt-format search-r1"
)


def test_a_template_that_renders_tools_is_kept(chat_tokenizer_dir: Path) -> None:
    tok = load_tokenizer(str(chat_tokenizer_dir))
    before = tok.chat_template
    assert not drops_tools(tok)
    assert prepare_chat_template(tok, model="qwen-like") == "model" and tok.chat_template == before


def test_a_template_without_tools_is_refused_only_when_the_run_passes_tools(chat_tokenizer_dir: Path) -> None:
    tok = load_tokenizer(str(chat_tokenizer_dir))
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    with pytest.raises(ConfigError) as exc:
        prepare_chat_template(tok, model="m")
    assert str(exc.value) == REFUSAL.format(model="m")
    assert (
        prepare_chat_template(tok, model="m", tools=False) == "model"
    )  # search-r1 / no-search: no tools sent


def test_the_repo_template_needs_chatml_tokens() -> None:
    from searchrl.retrieval.encoders.encoder import bundled_minilm_path

    bert = load_tokenizer(str(bundled_minilm_path()))  # WordPiece: <|im_start|> is several tokens
    with pytest.raises(ConfigError, match=r"splits <\|im_start\|> into \d+ tokens"):
        prepare_chat_template(bert, model="minilm", choice="searchrl")


@pytest.mark.slow
def test_smollm2s_own_template_drops_the_tool(smollm2_dir: Path) -> None:
    tok = load_tokenizer(str(smollm2_dir))
    assert drops_tools(tok)
    with pytest.raises(ConfigError) as exc:
        prepare_chat_template(tok, model="smollm2-135m")
    assert str(exc.value) == REFUSAL.format(model="smollm2-135m")


@pytest.mark.slow
def test_the_repo_template_gives_smollm2_the_tool(smollm2_dir: Path) -> None:
    tok = load_tokenizer(str(smollm2_dir))
    assert prepare_chat_template(tok, model="smollm2-135m", choice="searchrl") == "searchrl"
    assert tok.chat_template == CHATML_HERMES_TEMPLATE and not drops_tools(tok)
    renderer = ChatRenderer(tok)
    prompt = renderer.initial(build_messages("Who wrote Hamlet?"), training_tool_schemas())
    assert '<tools>\n{"type": "function", "function": {"name": "search"' in prompt
    assert renderer.end_of_turn == "<|im_end|>\n" and renderer.close_turn("x") == "x<|im_end|>"
    turn = renderer.tool_turn(["Doc 1"], training_tool_schemas(), after_close=True)
    assert "<tool_response>\nDoc 1\n</tool_response>" in turn


@pytest.mark.live
@pytest.mark.slow
def test_eval_refuses_smollm2s_template_before_loading_weights(
    smollm2_dir: Path,
    live_bm25_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from searchrl.infer.local import LocalLLM

    def no_load(*a: object, **k: object) -> None:
        raise AssertionError("loaded the weights before checking the template")

    monkeypatch.setattr(LocalLLM, "from_pretrained", no_load)
    args = ["eval", "--engine", "local", "--model", str(smollm2_dir), "--retrieval-url", live_bm25_url,
            "--qa", str(TINY_QA), "--output-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: " + REFUSAL.format(model=smollm2_dir)
    assert not list(tmp_path.glob("*.json"))


def test_the_template_that_ran_is_in_the_protocol_hash() -> None:
    from searchrl.infer.protocol import build_protocol
    from searchrl.infer.settings import InferSettings

    docs = [
        build_protocol(
            InferSettings(chat_template=choice),
            retrieval_info={},
            qa_path=TINY_QA,
            n_questions=5,
            chat_template="t",
        )
        for choice in ("model", "searchrl")
    ]
    assert [d["chat_template_source"] for d in docs] == ["model", "searchrl"]
    assert docs[0]["protocol_hash"] != docs[1]["protocol_hash"]
