"""Fixtures for infer/: a ChatML tokenizer and a tiny random Qwen2 model built offline, scripted LLM servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# ChatML with a hermes tool block, the structure Qwen2.5's template has (written for these tests). Newlines are
# emitted as {{ NL }} expressions because transformers renders with trim_blocks (a newline after a tag is eaten).
_NL = "{{ '\\n' }}"
CHATML_TOOLS_TEMPLATE = "".join(
    [
        "{% if tools %}<|im_start|>system" + _NL,
        "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}",
        _NL
        + _NL
        + "# Tools"
        + _NL
        + _NL
        + "You may call one or more functions to assist with the user query."
        + _NL
        + _NL,
        "You are provided with function signatures within <tools></tools> XML tags:" + _NL + "<tools>",
        "{% for tool in tools %}" + _NL + "{{ tool | tojson }}{% endfor %}" + _NL + "</tools>" + _NL + _NL,
        "For each function call, return a json object with function name and arguments within ",
        "<tool_call></tool_call> XML tags:" + _NL + "<tool_call>" + _NL,
        '{"name": <function-name>, "arguments": <args-json-object>}' + _NL + "</tool_call><|im_end|>" + _NL,
        "{% elif messages[0].role == 'system' %}<|im_start|>system"
        + _NL
        + "{{ messages[0].content }}<|im_end|>"
        + _NL,
        "{% endif %}",
        "{% for m in messages %}",
        "{% if m.role == 'system' %}",
        "{% elif m.role == 'tool' %}",
        "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}",
        _NL + "<tool_response>" + _NL + "{{ m.content }}" + _NL + "</tool_response>",
        "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>" + _NL + "{% endif %}",
        "{% elif m.role == 'assistant' %}<|im_start|>assistant" + _NL + "{{ m.content }}",
        "{% for tc in m.tool_calls or [] %}" + _NL + "<tool_call>" + _NL,
        '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
        + _NL
        + "</tool_call>",
        "{% endfor %}<|im_end|>" + _NL,
        "{% else %}<|im_start|>{{ m.role }}" + _NL + "{{ m.content }}<|im_end|>" + _NL,
        "{% endif %}",
        "{% endfor %}",
        "{% if add_generation_prompt %}<|im_start|>assistant" + _NL + "{% endif %}",
    ]
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
]


def build_tokenizer(out_dir: Path, corpus_file: Path):  # -> PreTrainedTokenizerFast
    """A byte-level BPE (lossless on any text) trained in well under a second on the fixture corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train([str(corpus_file)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TOOLS_TEMPLATE,
    )
    fast.add_tokens(ADDED)
    fast.save_pretrained(out_dir)
    return fast


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path) -> Path:
    out = tmp_path_factory.mktemp("chatml-tokenizer")
    build_tokenizer(out, tiny_corpus)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 (about 60k parameters) with the ChatML tokenizer, saved as HF."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("tiny-qwen2")
    tok = build_tokenizer(out, tiny_corpus)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def chat_renderer(chat_tokenizer_dir: Path):  # -> ChatRenderer
    from searchrl.infer.llm import ChatRenderer

    return ChatRenderer.from_pretrained(str(chat_tokenizer_dir))


def serve_scripts(scripts) -> Iterator[tuple[str, object]]:  # (base url with /v1, app)
    from tests.infer.scripted_llm import create_scripted_app
    from tests.live import serve_in_thread

    app = create_scripted_app(scripts)
    with serve_in_thread(app) as url:
        yield f"{url}/v1", app
