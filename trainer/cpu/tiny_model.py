"""A tiny Qwen2-shaped model and an offline Qwen2.5-style tokenizer: training on CPU with nothing downloaded.

`make train-cpu` (trainer/proofs/train_cpu.py) runs verl's real GRPO loop before anyone rents a GPU; the tests drive
verl's agent loop the same way. Neither may download weights, so both are made here:

- the tokenizer: a byte-level BPE trained in milliseconds with the `tokenizers` library on the texts the run will
  see (so any of them round-trips exactly), the ChatML special tokens, `<tool_call>`/`</tool_call>` as added
  tokens (as in Qwen2.5), and the ChatML + hermes chat template of searchrl/chat_template.py, which renders tools
  into the system turn, assistant tool calls as `<tool_call>{json}</tool_call>`, and tool results as a user turn
  of `<tool_response>` blocks, the layout Qwen2.5-Instruct uses. verl picks its Qwen token builder from `hf_model_type="qwen2"`, and its Qwen2 chat
  handling needs `"\\n"` to be one token, which a byte-level alphabet guarantees.
- the model: `Qwen2ForCausalLM` from a transformers config (a few hundred thousand random weights, seeded), saved
  as a Hugging Face folder that verl's FSDP engine, its model merger and our eval engine all load like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# re-exported (the `as` form says so to mypy): trainer/proofs/train_cpu.py and the tests import it from here
from searchrl.chat_template import CHATML_HERMES_TEMPLATE as CHATML_HERMES_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a Qwen-like PreTrainedTokenizerFast."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.add_tokens(
        TOOL_TOKENS
    )  # not special: decode(skip_special_tokens=True) keeps them, as in Qwen2.5
    tokenizer.chat_template = CHATML_HERMES_TEMPLATE
    return tokenizer


def tiny_qwen2_config(vocab_size: int, *, hidden_size: int = 32, **overrides: Any) -> Any:
    """A Qwen2Config small enough for CPU tests (2 layers, 4 heads over 2 KV heads unless `overrides` say
    otherwise), naming its architecture as `from_pretrained` would: verl's merger reads it."""
    from transformers import Qwen2Config

    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "architectures": ["Qwen2ForCausalLM"],
        **overrides,
    }
    return Qwen2Config(**fields)


def write_tiny_model(
    out_dir: Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 2000,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight Qwen2 causal LM and its tokenizer to `out_dir` (a Hugging Face model folder)."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    tokenizer = build_tokenizer(texts, vocab_size=vocab_size)
    config = tiny_qwen2_config(
        len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out_dir)
    return out_dir
