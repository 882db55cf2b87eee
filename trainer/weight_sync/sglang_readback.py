"""Which models sglang 0.5.12 can read back, so `ROLLOUT=sglang` is refused at plan time where it cannot.

The sglang weight-sync check (trainer/weight_sync/sglang_sync.py) reads every synced tensor back through sglang's
`/get_weights_by_name`. In sglang 0.5.12 (the version verl 0.9.1's `sglang` extra pins) that route calls
`ModelRunner.get_weights_by_name` (srt/model_executor/model_runner.py:2133-2148, "TODO: Add support for Qwen
models"), which calls the model class's own `get_weights_by_name` and answers None (HTTP 400) when the class has
none. Only llama.py, opt.py, granite.py and exaone4.py define it; classes that subclass one of those inherit it.
Qwen2 (the default Qwen2.5-3B-Instruct) is not among them, so every sglang run with the default model would stop
at its first sync, after the lock install, data prep and model load on every node (ESTIMATE 14-22 H100-hours a
pair of attempts, issue 46).

READBACK_ARCHITECTURES is derived from the sglang 0.5.12 wheel itself, not written by hand:
tests/trainer/weight_sync/test_sglang_readback.py downloads the wheel from PyPI and walks the classes of
`sglang/srt/models/*.py` (each `EntryClass`, with its bases) and fails when this set differs.

Standard library only: the plan runs in the SkyPilot venv, which has no torch or sglang.
"""

from __future__ import annotations

import json
from pathlib import Path

SGLANG_VERSION = "0.5.12"
# HF `architectures[0]` names whose sglang 0.5.12 class defines or inherits get_weights_by_name (see above).
READBACK_ARCHITECTURES = frozenset(
    {
        "Exaone4ForCausalLM",
        "GraniteForCausalLM",
        "IQuestCoderForCausalLM",
        "InternLM3ForCausalLM",
        "Llama4ForCausalLM",
        "LlamaForCausalLM",
        "LlamaForCausalLMEagle",
        "LlamaForCausalLMEagle3",
        "Ministral3ForCausalLM",
        "MistralForCausalLM",
        "MistralForCausalLMEagle",
        "OPTForCausalLM",
        "Phi3ForCausalLM",
        "TeleFLMForCausalLM",
    }
)
# A hub model name's family -> its architecture, for a plan made where the model's config.json is not at hand
# (the plan downloads nothing). First match of the lower-cased name after the organisation wins.
NAME_FAMILIES = (
    ("qwen3", "Qwen3ForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),  # Qwen2 and Qwen2.5
    ("qwen1.5", "Qwen2ForCausalLM"),
    ("llama-4", "Llama4ForCausalLM"),
    ("llama", "LlamaForCausalLM"),  # Llama 2 and 3.x, and every *llama* fine-tune that keeps the class
    ("smollm", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("phi-3", "Phi3ForCausalLM"),
)


def model_architecture(model: str) -> str | None:
    """The model's architecture: `architectures[0]` of a local model folder's config.json, else by name family
    (NAME_FAMILIES); None when neither tells."""
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        try:
            names = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            names = []
        return str(names[0]) if names else None
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((arch for prefix, arch in NAME_FAMILIES if name.startswith(prefix)), None)


def readback_refusal(model: str) -> str | None:
    """Why `ROLLOUT=sglang` cannot check this model's weight syncs (one line with the fix), or None.

    A model whose architecture is unknown here is not refused: the check still runs at the first sync and stops
    the run there with the name it could not read (trainer/weight_sync/sglang_sync.py), so nothing fails silently.
    """
    arch = model_architecture(model)
    if arch is None or arch in READBACK_ARCHITECTURES:
        return None
    return (
        f"ROLLOUT=sglang cannot check the weight sync of {model}: sglang {SGLANG_VERSION}'s {arch} has no "
        "get_weights_by_name (its /get_weights_by_name answers 400), so the run would stop at its first sync; "
        "use ROLLOUT=vllm (the default), or a model sglang reads back (e.g. LlamaForCausalLM, MistralForCausalLM)"
    )


__all__ = [
    "NAME_FAMILIES",
    "READBACK_ARCHITECTURES",
    "SGLANG_VERSION",
    "model_architecture",
    "readback_refusal",
]
