"""Packed vs padded micro batches through verl 0.9.1's own FSDP engine on CPU (gloo, world size 1, fp32, sdpa).

Run by tests/trainer/test_packed_sdpa.py as `python -m tests.trainer.packed_engine OUT_DIR`, in a process of its own:
verl reads VERL_PLATFORM at import (trainer/cpu/plugin.py's CPU platform) and the engine needs a process group.
Prints one JSON object: for each way of running the same samples, the largest difference from the padded run in
per-token log-probs, entropy and (when it trains) every parameter's gradient.

Nothing here re-implements packing: `FSDPEngineWithLMHead.forward_backward_batch` (verl/workers/engine/fsdp/
transformer_impl.py) splits the batch with verl's `prepare_micro_batches`, packs each micro batch into one row
(`use_remove_padding=True`: the samples' tokens and position ids concatenated, attention_mask None) or pads it to
its longest sample (False), calls the model with `use_cache=False`, and unpacks log-probs and entropy per sample.
Under sdpa, transformers then builds a block-diagonal causal mask from the position ids restarting at 0
(masking_utils.find_packed_sequence_indices), only when no cache is passed.

Variants (same weights, same samples of lengths 7, 19, 12, 3, 16):
- padded:          use_remove_padding=False, one micro batch of 5 rows (the FLASH_ATTN=0 path)
- packed:          use_remove_padding=True, one packed micro batch
- packed_dynamic:  packed, with use_dynamic_bsz and a 24-token budget: several micro batches, as a GPU run packs
- leak_positions:  packed, position ids counting on across samples (no restart at 0): samples see each other
- leak_use_cache:  packed log-prob pass (forward only, as the reference and old-policy passes run) with
                   use_cache=True: transformers builds a cache, so it skips the packed-sequence mask. (In training,
                   gradient checkpointing makes transformers drop use_cache=True by itself.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

LENGTHS = (7, 19, 12, 3, 16)
VOCAB = 256
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _setup(out: Path) -> None:
    import os

    from searchrl.trainer.cpu.plugin import ENV

    os.environ.update(ENV)  # before verl is imported: the CPU platform, FSDP engine registered for "cuda"
    import torch
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    from searchrl.trainer.cpu.tiny_model import tiny_qwen2_config

    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen2_config(VOCAB, hidden_size=64, attn_implementation="sdpa")).save_pretrained(
        out / "model"
    )
    dist.init_process_group("gloo", init_method=(out / "store").as_uri(), rank=0, world_size=1)


def fsdp_engine(model_dir: str, engine_config: Any, *, remove_padding: bool = True) -> Any:
    """verl's FSDP engine for a causal LM with sdpa, built as its training worker builds it (engine_workers.py:136-143,
    179); test_grad_accumulation.py builds its FSDP1 and FSDP2 engines here too."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    model = HFModelConfig(
        path=model_dir,
        load_tokenizer=False,
        use_remove_padding=remove_padding,
        enable_gradient_checkpointing=True,  # as the GPU overrides set it
        override_config={"attn_implementation": "sdpa"},
    )
    engine = EngineRegistry.new(
        model_type="language_model",
        backend=engine_config.strategy,
        model_config=model,
        engine_config=engine_config,
        optimizer_config=FSDPOptimizerConfig(lr=1e-3),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def _engine(model_dir: Path, remove_padding: bool) -> Any:
    """verl's FSDP2 engine in fp32."""
    from verl.workers.config import FSDPEngineConfig

    config = FSDPEngineConfig(
        strategy="fsdp2", dtype="float32", model_dtype="fp32", mixed_precision=FP32, use_torch_compile=False
    )
    return fsdp_engine(str(model_dir), config, remove_padding=remove_padding)


def _batch(remove_padding: bool, *, dynamic: bool = False, restart_positions: bool = True) -> Any:
    """The samples in verl's NO_PADDING layout (jagged nested tensors) with the keys its actor sets."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, VOCAB, (n,), generator=gen) for n in LENGTHS]
    weights = [torch.randn(n, generator=gen) for n in LENGTHS]
    starts = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()[:-1]]
    positions = [
        torch.arange(n) + (0 if restart_positions else s) for n, s in zip(LENGTHS, starts, strict=True)
    ]

    def nested(tensors: list[Any]) -> Any:
        return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested(positions),
            # a sample's last token has no next token: verl labels it with whatever follows in the flat batch
            # (torch.roll over all samples, in both paths) and never uses it; masked out of loss and comparison
            "loss_mask": nested([torch.cat([torch.ones(n - 1), torch.zeros(1)]) for n in LENGTHS]),
            "weights": nested(weights),
        },
        batch_size=[len(LENGTHS)],
    )
    tu.assign_non_tensor(
        data,
        use_remove_padding=remove_padding,
        use_dynamic_bsz=dynamic,
        max_token_len_per_gpu=24,
        micro_batch_size_per_gpu=len(LENGTHS),
        calculate_entropy=True,
        temperature=1.0,
        use_fused_kernels=False,
        return_model_output=True,
    )
    return data


def _loss(model_output: dict[str, Any], data: Any, dp_group: Any = None) -> tuple[Any, dict[str, Any]]:
    """A sum over tokens of weighted log-probs plus an entropy bonus: every token's log-prob and entropy reach the
    gradient, and splitting the batch into micro batches leaves the total unchanged (no per-micro-batch mean)."""
    log_probs = model_output["log_probs"].values()
    entropy = model_output["entropy"].values()
    mask = data["loss_mask"].values()
    return (log_probs * data["weights"].values() * mask).sum() + 0.1 * (entropy * mask).sum(), {}


def _run(engine: Any, data: Any, *, train: bool = True, use_cache: bool = False) -> dict[str, Any]:
    """One forward (and backward when `train`) of verl's engine; per-sample outputs and full gradients."""
    original = engine.module.forward
    shapes: list[
        list[int]
    ] = []  # input_ids shape of every model call: (1, tokens) packed, (rows, longest) padded

    def forward(*args: Any, **kwargs: Any) -> Any:
        shapes.append(list(kwargs["input_ids"].shape))
        return original(*args, **{**kwargs, "use_cache": True} if use_cache else kwargs)

    engine.module.forward = (
        forward  # the engine calls module(..., use_cache=False); a control flips only that
    )
    try:
        engine.optimizer_zero_grad()
        mode = engine.train_mode() if train else engine.eval_mode()
        with mode:
            out = engine.forward_backward_batch(data, _loss, forward_only=not train)
            grads = {
                name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                for name, p in engine.module.named_parameters()
                if train and p.grad is not None
            }
    finally:
        del engine.module.forward
    return {
        "calls": shapes,
        "log_probs": [
            lp[:-1] for lp in out["model_output"]["log_probs"].unbind()
        ],  # the last one: see _batch
        "entropy": list(out["model_output"]["entropy"].unbind()),
        "grads": grads,
    }


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    def worst(xs: list[Any], ys: list[Any]) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(xs, ys, strict=True))

    return {
        "calls": a["calls"],
        "log_probs": worst(a["log_probs"], b["log_probs"]),
        "entropy": worst(a["entropy"], b["entropy"]),
        "grads": worst(
            [a["grads"][k] for k in sorted(a["grads"])], [b["grads"][k] for k in sorted(a["grads"])]
        )
        if a["grads"]
        else None,
    }


def main(out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    _setup(out)
    packed_engine, padded_engine = _engine(out / "model", True), _engine(out / "model", False)
    padded = _run(padded_engine, _batch(False))
    padded_eval = _run(padded_engine, _batch(False), train=False)
    nonzero = min(float(g.abs().max()) for g in padded["grads"].values())
    result = {
        "lengths": list(LENGTHS),
        "padded_calls": padded["calls"],
        "grad_params": len(padded["grads"]),
        "smallest_max_grad": nonzero,
        "packed": _diff(_run(packed_engine, _batch(True)), padded),
        "packed_dynamic": _diff(_run(packed_engine, _batch(True, dynamic=True)), padded),
        "leak_positions": _diff(_run(packed_engine, _batch(True, restart_positions=False)), padded),
        "leak_use_cache": _diff(_run(packed_engine, _batch(True), train=False, use_cache=True), padded_eval),
        "packed_eval": _diff(_run(packed_engine, _batch(True), train=False), padded_eval),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))  # noqa: T201
