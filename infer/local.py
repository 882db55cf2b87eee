"""Local generation with Hugging Face transformers, for small models and people without an inference server.

    searchrl eval --engine local --model Qwen/Qwen2.5-0.5B-Instruct --qa dev --retrieval-url http://127.0.0.1:8000
    searchrl eval --engine local --model smollm2-135m ...     # a known name: `searchrl model get` (searchrl/models.py)

`LocalLLM.complete` behaves like `/v1/completions` on sglang/vLLM: it takes the rendered prompt text, stops at
the tokenizer's EOS, a stop string or `max_tokens`, and returns the new text without the EOS token or the stop
string, so the agent loop is the same for both engines.

Batching: the questions in flight (`--concurrency`) call `complete` at once; requests that arrive within
`batch_wait_s` of each other and share their sampling settings run as one left-padded `generate()` call (up to
`max_batch` rows), in a worker thread so the event loop stays free for retrieval calls. Generation at batch 1 used
a fraction of the CPU (SmolLM2-135M, 2 cores: ~21 tok/s at batch 1, ~70-85 at 8-16; ../shared/DESIGN.md 5d).
Each row stops on its own: its EOS, its stop strings (transformers' `StopStringCriteria`, checked as tokens are
generated, so nothing after a stop is generated) or its own `max_tokens`; a finished row only waits, padded, for
the batch's longest. Greedy results can differ from batch-1 results in the last bits of the logits (other matmul
shapes), and a sampled batch shares one seed: as with sglang without deterministic inference, a sampled run is
reproducible only with `--concurrency 1`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from searchrl.batches import run_batch
from searchrl.errors import InferenceError
from searchrl.infer.llm import Completion, Sampling, load_tokenizer

log = logging.getLogger(__name__)


def pick_device(device: str) -> str:
    """`auto` is CUDA when torch sees a GPU, else the CPU; anything else as given."""
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


@dataclass
class _Request:
    prompt: str
    sampling: Sampling
    future: asyncio.Future[Completion]


@dataclass
class EngineStats:
    """What the engine did over its life: the eval summary's tokens/s and batch sizes come from here."""

    batches: int = 0
    sequences: int = 0
    generated_tokens: int = 0  # tokens each row generated up to its own end (EOS, stop or cap), EOS included
    padded_tokens: int = 0  # steps finished rows spent waiting for the batch's longest row
    model_s: float = 0.0  # seconds inside generate()
    batch_sizes: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "sequences": self.sequences,
            "mean_batch": round(self.sequences / self.batches, 2) if self.batches else 0.0,
            "generated_tokens": self.generated_tokens,
            "padded_tokens": self.padded_tokens,
            "model_s": round(self.model_s, 3),
            "tokens_per_s": round(self.generated_tokens / self.model_s, 2) if self.model_s else 0.0,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
        }


class _RowEnds:
    """A stopping criterion that ends each row on its own and records why and when.

    transformers ORs the criteria and pads finished rows with `pad_token_id`, which is often the EOS id itself,
    so the output alone cannot tell a row that hit its cap from one that generated EOS; this records it.
    generate() calls it once per new token, so it also reports how many rows made a token (`on_tokens`): the
    progress bar's token count inside a question, which adds up to `EngineStats.generated_tokens`.
    """

    def __init__(
        self,
        start: int,
        limits: list[int],
        eos_ids: list[int],
        stops: Any,
        stop_strings: tuple[str, ...] = (),
        tokenizer: Any = None,
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        import torch

        self.start = start
        self.on_tokens = on_tokens
        self.running = len(limits)  # rows that have not ended: each made a token at this call
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        self.limits = torch.tensor(limits)
        self.eos = torch.tensor(eos_ids)
        self.stops = stops  # transformers.StopStringCriteria or None
        self.ended_at: list[int | None] = [None] * len(limits)
        self.reason: list[str] = ["length"] * len(limits)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.start
        if self.on_tokens is not None:
            self.on_tokens(self.running)
        eos = torch.isin(input_ids[:, -1], self.eos.to(input_ids.device))
        stop = (
            self.stops(input_ids, scores).to(eos.device) if self.stops is not None else torch.zeros_like(eos)
        )
        # StopStringCriteria also matches a stop string that begins in the prompt ("\n" ending the assistant
        # header + a generated "\n\n"); servers match in the generated text only, so a hit must be in it
        for i in torch.nonzero(stop).flatten().tolist():
            text = self.tokenizer.decode(input_ids[i, self.start :], skip_special_tokens=True)
            if not any(s in text for s in self.stop_strings):
                stop[i] = False
        cap = torch.full_like(eos, False) | (step >= self.limits.to(eos.device))
        done = eos | stop | cap
        for i in torch.nonzero(done).flatten().tolist():
            if self.ended_at[i] is None:
                self.ended_at[i] = step
                self.running -= 1
                self.reason[i] = "eos" if eos[i] else "stop" if stop[i] else "length"
        return done


class LocalLLM:
    """A causal LM and its tokenizer loaded in this process, batching the requests that arrive together."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        max_batch: int = 16,
        batch_wait_s: float = 0.02,
        threads: int = 0,
    ) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch = max_batch  # rows per generate(); 16 measured best on 2 cores (DESIGN.md 5d)
        self.batch_wait_s = (
            batch_wait_s  # how long a batch waits for requests still coming (a search returns)
        )
        self.stats = EngineStats()
        self._live_tokens = 0  # generated so far, the batch in generate() now included (the bar reads it)
        # torch threads for generate(), set in the worker thread itself: a thread that has not set them runs
        # OpenMP/MKL at their defaults, not at what the main thread chose (measured: 15x slower matmuls under
        # load). 0 = what this process uses now (torch's default: all cores).
        self.threads = threads or torch.get_num_threads()
        self._pending: list[_Request] = []
        self._worker: asyncio.Task[None] | None = None
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
        pad = tokenizer.pad_token_id
        self._pad_id: int = pad if pad is not None else self._eos_ids[0]
        self._stop_criteria: dict[tuple[str, ...], Any] = {}

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        tokenizer: str | Any | None = None,
        device: str = "auto",
        threads: int = 0,
    ) -> LocalLLM:
        """Load a HF model id or folder (downloads through huggingface_hub when it is an id).

        `tokenizer`: a folder/id, or an already loaded tokenizer (whose chat template the caller checked).
        """
        import torch
        from transformers import AutoModelForCausalLM

        dev = pick_device(device)
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
        # transformers decorates PreTrainedModel.to with functools.wraps(nn.Module.to), which mypy reads unbound
        model.to(dev).eval()  # type: ignore[arg-type]
        log.info(
            "loaded %s on %s (%d parameters)", name_or_path, dev, sum(p.numel() for p in model.parameters())
        )
        return cls(model, tok, device=dev, threads=threads)

    # --- one batch ---------------------------------------------------------------------------------------------
    def _stops(self, stop: tuple[str, ...]) -> Any:
        if not stop:
            return None
        if stop not in self._stop_criteria:  # builds a table over the vocabulary: once per stop set
            from transformers import StopStringCriteria

            self._stop_criteria[stop] = StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(stop))
        return self._stop_criteria[stop]

    def _generate_batch(self, prompts: list[str], samplings: list[Sampling]) -> list[Completion]:
        """One left-padded generate() over prompts that share sampling settings (max_tokens may differ)."""
        import torch
        from transformers import StoppingCriteriaList

        torch.set_num_threads(self.threads)
        sampling = samplings[0]
        rows = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        limits = [s.max_tokens for s in samplings]
        ends = _RowEnds(
            width,
            limits,
            self._eos_ids,
            self._stops(sampling.stop),
            sampling.stop,
            self.tokenizer,
            self._count_tokens,
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": max(limits),
            "eos_token_id": self._eos_ids,
            "pad_token_id": self._pad_id,
            "stopping_criteria": StoppingCriteriaList([ends]),
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
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs
            )
        took = time.perf_counter() - t0
        steps = int(out.shape[1]) - width
        results = []
        for i, r in enumerate(rows):
            ended = ends.ended_at[i]
            n = ended if ended is not None else steps
            new_ids = out[i, width : width + n].tolist()
            self.stats.generated_tokens += len(new_ids)
            self.stats.padded_tokens += steps - len(new_ids)
            finish = "stop" if ends.reason[i] in ("eos", "stop") else "length"
            if ends.reason[i] == "eos" and new_ids and new_ids[-1] in self._eos_ids:
                new_ids = new_ids[:-1]
            text = self.tokenizer.decode(new_ids, skip_special_tokens=True)  # as vLLM and sglang do
            matched = None
            for stop in samplings[i].stop:  # servers return the text before the stop string, without it
                idx = text.find(stop)
                if idx >= 0 and (matched is None or idx < text.find(matched)):
                    matched = stop
            if matched is not None:
                text, finish = text[: text.find(matched)], "stop"
            results.append(
                Completion(
                    text=text,
                    finish_reason=finish,
                    prompt_tokens=len(r),
                    completion_tokens=len(new_ids),
                    matched_stop=matched,
                    stop_reported=True,
                    model_s=took,
                )
            )
        self.stats.batches += 1
        self.stats.sequences += len(rows)
        self.stats.model_s += took
        self.stats.batch_sizes[len(rows)] = self.stats.batch_sizes.get(len(rows), 0) + 1
        log.debug("batch of %d: %d steps in %.2fs", len(rows), steps, took)
        return results

    def _count_tokens(self, n: int) -> None:
        """Called from generate()'s thread once per step with the rows that made a token (one int add)."""
        self._live_tokens += n

    def tokens_generated(self) -> int:
        """Tokens generated so far, the batch still in generate() included: progress inside a long question.

        `stats.generated_tokens` grows only when a batch returns, minutes later for a model that rambles to its
        budget on CPU; this grows with every step (infer/agent.py `run_questions` shows it in the bar).
        """
        return self._live_tokens

    def _generate(self, prompt: str, sampling: Sampling) -> Completion:
        """One prompt alone (batch 1), as `complete` runs it when nothing else is in flight."""
        return self._generate_batch([prompt], [sampling])[0]

    # --- the queue ---------------------------------------------------------------------------------------------
    def _take_batch(self) -> list[_Request]:
        """The oldest request and the next ones that share its sampling settings (other max_tokens allowed)."""
        key = replace(self._pending[0].sampling, max_tokens=0)
        batch = [r for r in self._pending if replace(r.sampling, max_tokens=0) == key][: self.max_batch]
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        return [r for r in batch if not r.future.done()]  # a caller cancelled while queued

    async def _drain(self) -> None:
        while self._pending:
            if len(self._pending) < self.max_batch and self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)  # let the requests of this moment join
            batch = self._take_batch()
            if not batch:
                continue
            prompts, samplings = [r.prompt for r in batch], [r.sampling for r in batch]
            await run_batch([r.future for r in batch], partial(self._generate_batch, prompts, samplings))

    def weights_identity(self) -> dict[str, Any]:
        """What identifies the loaded weights (`weights_identity` above), for the protocol hash."""
        return weights_identity(str(getattr(self.model, "name_or_path", "") or ""))

    async def complete(self, prompt: str, sampling: Sampling) -> Completion:
        loop = asyncio.get_running_loop()
        req = _Request(prompt, sampling, loop.create_future())
        self._pending.append(req)
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._drain())
        return await req.future

    async def aclose(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        return None


__all__ = ["EngineStats", "LocalLLM", "pick_device"]
