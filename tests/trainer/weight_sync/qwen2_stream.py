"""The weights verl's FSDP engine streams to a rollout server for a one-layer Qwen2, shared by the vLLM and sglang
weight-sync stand-ins (tests/trainer/weight_sync/test_vllm_sync.py, tests/trainer/weight_sync/test_sglang_sync.py): both servers receive
the same HF-named fp32 tensors and differ only in how they fuse, shard and pad them.

Sizes: a vocabulary of 10 padded to 16 rows (the servers' vocab padding), hidden 8, 8 query rows and 4 KV rows
(4 query and 2 KV heads of HEAD_DIM 2), an MLP of 12. Norm weights near 1 as trained ones are.
"""

from __future__ import annotations

import torch

VOCAB, PADDED, HIDDEN, Q, KV, FFN, HEAD_DIM = 10, 16, 8, 8, 4, 12, 2
PREFIX = "model.layers.0."


def hf_weights(seed: int) -> dict[str, torch.Tensor]:
    """What verl's FSDP engine streams for a one-layer Qwen2 (fp32, HF names, tied lm_head sent too)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    w = {
        "model.embed_tokens.weight": r(VOCAB, HIDDEN),
        PREFIX + "self_attn.q_proj.weight": r(Q, HIDDEN),
        PREFIX + "self_attn.k_proj.weight": r(KV, HIDDEN),
        PREFIX + "self_attn.v_proj.weight": r(KV, HIDDEN),
        PREFIX + "self_attn.q_proj.bias": r(Q),
        PREFIX + "self_attn.k_proj.bias": r(KV),
        PREFIX + "self_attn.v_proj.bias": r(KV),
        PREFIX + "self_attn.o_proj.weight": r(HIDDEN, Q),
        PREFIX + "mlp.gate_proj.weight": r(FFN, HIDDEN),
        PREFIX + "mlp.up_proj.weight": r(FFN, HIDDEN),
        PREFIX + "mlp.down_proj.weight": r(HIDDEN, FFN),
        PREFIX + "input_layernorm.weight": 1 + 0.1 * r(HIDDEN),
        PREFIX + "post_attention_layernorm.weight": 1 + 0.1 * r(HIDDEN),
        "model.norm.weight": 1 + 0.1 * r(HIDDEN),
    }
    w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    return w
