"""Local generation with Hugging Face transformers, for small models and people without an inference server.

    searchrl eval --engine local --model Qwen/Qwen2.5-0.5B-Instruct --qa dev --retrieval-url http://127.0.0.1:8000

`LocalLLM.complete` behaves like `/v1/completions` on sglang/vLLM: it takes the rendered prompt text, stops at
the tokenizer's EOS (or `max_tokens`), and returns the new text without the EOS token, so the agent loop is
the same for both engines. Generation runs in a worker thread, one request at a time (a single model on one
device gains little from interleaving), so the event loop stays free for retrieval calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

from searchrl.errors import InferenceError
from searchrl.infer.llm import Completion, Sampling, load_tokenizer

log = logging.getLogger(__name__)


def _pick_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


_SAMPLE_BYTES = 1 << 20


def _model_dir(name_or_path: str) -> Path | None:
    """The folder holding the weights: the path itself, or the HF cache snapshot of a model id."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, local_files_only=True, allow_patterns=["*.json"]))
    except Exception:  # not cached, not an id: nothing to identify it by
        return None


def weights_identity(name_or_path: str) -> dict[str, Any]:
    """sha256 of the safetensors index plus, per weights file, its size and first/last MiB of tensor data.

    Hashing whole checkpoints (GBs) at every start is too slow; the index alone (tensor names, dtypes,
    offsets) is the same for two checkpoints of one architecture. The sampled bytes are weights, so a new
    checkpoint in the same folder gets another value; two checkpoints that differ only inside the unsampled
    middle of every file do not (docs/inference.md). A HF cache snapshot also names its commit.
    """
    folder = _model_dir(name_or_path)
    if folder is None:
        return {}
    h = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors"))
    for name in ("model.safetensors.index.json", "config.json"):
        if (folder / name).is_file():
            h.update(name.encode() + b"\0" + (folder / name).read_bytes())
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            header = int.from_bytes(fh.read(8), "little") if size >= 8 else 0
            fh.seek(min(8 + header, size))
            h.update(fh.read(_SAMPLE_BYTES))
            fh.seek(max(size - _SAMPLE_BYTES, 0))
            h.update(fh.read(_SAMPLE_BYTES))
    out: dict[str, Any] = {"weights_sample_sha256": h.hexdigest()[:16], "weights_files": len(files)}
    if "snapshots" in folder.parts:
        out["hf_commit"] = folder.name
    return out


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
        cls, name_or_path: str, *, tokenizer: str | Any | None = None, device: str = "auto"
    ) -> LocalLLM:
        """Load a HF model id or folder (downloads through huggingface_hub when it is an id).

        `tokenizer`: a folder/id, or an already loaded tokenizer (whose chat template the caller checked).
        """
        import torch
        from transformers import AutoModelForCausalLM

        dev = _pick_device(device)
        tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, str) else None
        if tok is None:
            tok = load_tokenizer(tokenizer or name_or_path)
        try:
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
        # Every knob explicit: generate() otherwise takes the model's generation_config.json (Qwen2.5 instruct:
        # repetition_penalty 1.05, top_k 20), as servers do for fields a request leaves out (infer/llm.py).
        kwargs["repetition_penalty"] = sampling.repetition_penalty
        kwargs["min_p"] = sampling.min_p or None
        if sampling.temperature > 0:
            torch.manual_seed(sampling.seed)
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else None,
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = self.model.generate(**enc, **kwargs)
        new_ids = out[0, n_prompt:].tolist()
        finish = "length"
        if new_ids and new_ids[-1] in self._eos_ids:
            new_ids, finish = new_ids[:-1], "stop"
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)  # as vLLM and sglang do
        matched = None
        for stop in sampling.stop:  # stop strings are cut after the fact, as the server would not return them
            idx = text.find(stop)
            if idx >= 0:
                text, finish, matched = text[:idx], "stop", stop
        return Completion(
            text=text,
            finish_reason=finish,
            prompt_tokens=n_prompt,
            completion_tokens=len(new_ids),
            matched_stop=matched,
            stop_reported=True,
        )

    def weights_identity(self) -> dict[str, Any]:
        """What identifies the loaded weights (infer/weights.py), for the protocol hash."""
        return weights_identity(str(getattr(self.model, "name_or_path", "") or ""))

    async def complete(self, prompt: str, sampling: Sampling) -> Completion:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt, sampling)

    async def aclose(self) -> None:
        return None


__all__ = ["LocalLLM"]
