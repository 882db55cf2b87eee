"""Local generation with Hugging Face transformers, for small models and people without an inference server.

    searchrl eval --engine local --model Qwen/Qwen2.5-0.5B-Instruct --qa dev --retrieval-url http://127.0.0.1:8000

`LocalLLM.complete` behaves like `/v1/completions` on sglang/vLLM: it takes the rendered prompt text, stops at
the tokenizer's EOS (or `max_tokens`), and returns the new text without the EOS token, so the agent loop is
the same for both engines. Generation runs in a worker thread, one request at a time (a single model on one
device gains little from interleaving), so the event loop stays free for retrieval calls.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from searchrl.errors import InferenceError
from searchrl.infer.llm import Completion, Sampling

log = logging.getLogger(__name__)


def _pick_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class LocalLLM:
    """A causal LM and its tokenizer loaded in this process."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str = "cpu") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self._lock = asyncio.Lock()
        eos = tokenizer.eos_token_id
        self._eos_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for extra in [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []):
            if extra not in self._eos_ids:
                self._eos_ids.append(extra)
        if not self._eos_ids:
            raise InferenceError(
                "the tokenizer has no eos_token; set one so generation knows where a turn ends"
            )

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, tokenizer: str | None = None, device: str = "auto"
    ) -> LocalLLM:
        """Load a HF model id or folder (downloads through huggingface_hub when it is an id)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = _pick_device(device)
        try:
            tok = AutoTokenizer.from_pretrained(tokenizer or name_or_path)
            model = AutoModelForCausalLM.from_pretrained(
                name_or_path, dtype=torch.bfloat16 if dev.startswith("cuda") else torch.float32
            )
        except (OSError, ValueError) as exc:
            raise InferenceError(
                f"cannot load model {name_or_path!r} locally ({exc.__class__.__name__}: {exc})"
            ) from exc
        model.to(dev).eval()
        log.info(
            "loaded %s on %s (%d parameters)", name_or_path, dev, sum(p.numel() for p in model.parameters())
        )
        return cls(model, tok, device=dev)

    def _generate(self, prompt: str, sampling: Sampling) -> Completion:
        import torch

        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.device)
        n_prompt = int(enc["input_ids"].shape[1])
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "eos_token_id": self._eos_ids,
            "pad_token_id": self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self._eos_ids[0],
        }
        if sampling.temperature > 0:
            torch.manual_seed(sampling.seed)
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = self.model.generate(**enc, **kwargs)
        new_ids = out[0, n_prompt:].tolist()
        finish = "length"
        if new_ids and new_ids[-1] in self._eos_ids:
            new_ids, finish = new_ids[:-1], "stop"
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)  # as vLLM and sglang do
        for stop in sampling.stop:  # stop strings are cut after the fact, as the server would not return them
            idx = text.find(stop)
            if idx >= 0:
                text, finish = text[:idx], "stop"
        return Completion(
            text=text, finish_reason=finish, prompt_tokens=n_prompt, completion_tokens=len(new_ids)
        )

    async def complete(self, prompt: str, sampling: Sampling) -> Completion:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt, sampling)

    async def aclose(self) -> None:
        return None


__all__ = ["LocalLLM"]
