"""`make bench-step-checks`: the driver's loss-mask checks of one training step, timed at GPU scale (issue 53).

    searchrl train bench-step-checks smollm2-135m                  # 2,560 x 1,500 tokens (make bench-step-checks)
    searchrl train bench-step-checks data/models/x --trajectories 64 --tokens 300 --repeats 1

Every training step, verl's driver runs trainer/plugins/sampler.py's `loss_step_metrics` on the whole batch while
the GPUs wait: the mask invariant against the recorded generated spans (trainer/plugins/generated_spans.py) and
the `<tool_response>` counts from the token text (trainer/plugins/masks.py). A GPU step of the recipe is 512
prompts x 5 samples = 2,560 trajectories of 1,000-1,500 response tokens. This builds such a step with a real
tokenizer (a known model name, e.g. `smollm2-135m`, got as `searchrl model get` gets it, or a Hugging Face folder;
only its tokenizer is read) and times the check as the sampler runs it, from TransferQueue's jagged tensors to
the metrics, on every trajectory.

Each trajectory is what the agent loop builds, cut at exactly `tokens` tokens as verl cuts a response: assistant
turns the server generated (loss mask 1, recorded as generated spans) that think and call `search`, a quarter of
them writing a made-up `<tool_response>` of their own as SmolLM2 does (issue 32), each followed by the environment's
user turn of three bundled passages in a `<tool_response>` block (mask 0), and an answer near the end. Every turn
is drawn from pools of tokenized turns with a seeded RNG, so the trajectories differ from one another.

The same step also goes once through the string path the sampler ran before (`convert_ids_to_tokens` on every
trajectory, then `mask_step_metrics` on the strings): its time is printed, and its counts must equal the fast
path's or the bench fails. The last line is `step checks: X.XX s a step at T x N tokens`, the median of `repeats`.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from searchrl.devset import dev_qa_path
from searchrl.prompt import format_passages
from searchrl.trainer.plugins.generated_spans import SPANS, clip_spans, format_spans, record_of
from searchrl.trainer.plugins.masks import OPEN, TokenStrings, mask_step_metrics
from searchrl.trainer.plugins.sampler import loss_step_metrics, response_rows

ENV_HEAD = "\n<|im_start|>user\n<tool_response>\n"  # the environment's turn, as the ChatML/hermes template renders it
ENV_TAIL = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
POOL = 64  # tokenized turns of each kind the trajectories are drawn from


@dataclass
class StepChecksBench:
    """One step's check timed: the step's shape, its metrics, and the seconds of each run."""

    tokenizer: str  # what was asked for, and what it is
    trajectories: int
    tokens: int
    environment_blocks: int  # the environment's <tool_response> turns begun in the step (cut ones included)
    model_blocks: int  # the model's own turns with a made-up <tool_response>
    metrics: dict[str, float]
    table_s: float  # TokenStrings, built once per run of the trainer
    string_path_s: float | None  # convert_ids_to_tokens + mask_step_metrics on the same step, once
    runs: list[float] = field(default_factory=list)  # wall-clock seconds of each timed run
    # this process's CPU seconds of each: what the runs cost without the other processes sharing the cores
    cpu_runs: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return statistics.median(self.runs)

    def report(self, cpu: str) -> str:
        shape = f"{self.trajectories} x {self.tokens} tokens"
        lines = [
            f"the driver's loss-mask checks of one training step, {shape}, on {cpu}",
            f"tokenizer: {self.tokenizer}",
            f"step: {self.trajectories * self.tokens:,} response tokens; turns begun before the cut: "
            f"{self.environment_blocks:,} of the environment with a <tool_response> of bundled passages, "
            f"{self.model_blocks:,} of the model with a made-up one",
            "metrics: " + ", ".join(f"{k}={v:.0f}" for k, v in sorted(self.metrics.items())),
            f"token-string table: {self.table_s:.2f} s, once per run",
        ]
        if self.string_path_s is not None:
            lines.append(
                f"string path (convert_ids_to_tokens + mask_step_metrics, the sampler before issue 53): "
                f"{self.string_path_s:.2f} s, the same counts"
            )
        lines.append(
            "runs: "
            + " ".join(f"{s:.3f}" for s in self.runs)
            + " s wall-clock (median below), CPU time "
            + " ".join(f"{s:.3f}" for s in self.cpu_runs)
            + " s"
        )
        lines.append(f"step checks: {self.seconds:.2f} s a step at {shape}")
        return "\n".join(lines)


def load_tokenizer(name: str) -> Any:
    """The tokenizer of a known model name (got as `searchrl model get` gets it) or of a Hugging Face folder."""
    from transformers import AutoTokenizer

    from searchrl.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(name))


def describe(tokenizer: Any, name: str) -> str:
    """One line: the name, the kind of tokenizer, the vocabulary, and the tokens `<tool_response>` splits into."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(tokenizer).__name__
    if backend is not None:  # e.g. "BPE, ByteLevel pre-tokenizer", Qwen2.5's kind
        kind = f"{type(backend.model).__name__}, {type(backend.pre_tokenizer).__name__} pre-tokenizer"
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(OPEN, add_special_tokens=False))
    turn = tokenizer.convert_ids_to_tokens(tokenizer.encode("<|im_start|>", add_special_tokens=False))
    return (
        f"{name} ({kind}, {len(tokenizer):,} ids; {OPEN} is {len(pieces)} tokens {pieces}, <|im_start|> "
        f"{len(turn)})"
    )


def _pools(tokenizer: Any, rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    """Tokenized turns of each kind: the model's calls, its calls with a made-up response, its answers, and the
    environment's responses (three bundled passages each)."""
    from searchrl.retrieval.index.bundled import iter_bundled

    qa = [json.loads(line) for line in dev_qa_path().read_text(encoding="utf-8").splitlines()]
    passages = [p.contents for p in itertools.islice(iter_bundled(), 3 * POOL)]
    calls, made_up, answers, observations = [], [], [], []
    for i in range(POOL):
        row = qa[i % len(qa)]
        question, answer = row["question"], row["golden_answers"][0]
        query = json.dumps({"name": "search", "arguments": {"query_list": [question]}})
        call = f"<think>\nI need to find out: {question}\n</think>\n<tool_call>\n{query}\n</tool_call>"
        calls.append(call + "<|im_end|>")
        invented = format_passages([passages[(7 * i) % len(passages)]], max_chars_per_doc=160)
        made_up.append(f"{call}\n<tool_response>\n{invented}\n</tool_response><|im_end|>")
        answers.append(f"<think>\nThe passages say {answer}.\n</think>\n<answer>{answer}</answer><|im_end|>")
        docs = [passages[int(j)] for j in rng.choice(len(passages), size=3, replace=False)]
        observations.append(ENV_HEAD + format_passages(docs, max_chars_per_doc=400) + ENV_TAIL)
    texts = {"call": calls, "made_up": made_up, "answer": answers, "observation": observations}
    return {
        kind: [
            np.asarray(ids, dtype=np.int64) for ids in tokenizer(items, add_special_tokens=False)["input_ids"]
        ]
        for kind, items in texts.items()
    }


def build_step(
    tokenizer: Any, trajectories: int, tokens: int, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray], list[dict[str, Any]], int, int]:
    """(ids, loss masks, extra_fields with the generated-span record, environment blocks, made-up blocks) of a
    step whose every trajectory is exactly `tokens` long."""
    rng = np.random.default_rng(seed)
    pools = _pools(tokenizer, rng)
    all_ids, masks, extras = [], [], []
    environment = model = 0
    for _ in range(trajectories):
        parts: list[tuple[str, np.ndarray]] = []
        length = 0
        while length < tokens:
            if length > tokens - 120 or (parts and rng.random() < 0.1):  # the answer near the end, or early
                kind = "answer"  # the agent loop would stop there; the bench keeps going to `tokens`
            else:
                kind = "made_up" if rng.random() < 0.25 else "call"
            turns = [(kind, pools[kind][int(rng.integers(POOL))])]
            if kind != "answer":
                turns.append(("observation", pools["observation"][int(rng.integers(POOL))]))
            for part in turns:
                environment += part[0] == "observation"  # turns begun before the cut
                model += part[0] == "made_up"
                parts.append(part)
                length += len(part[1])
                if length >= tokens:
                    break
        spans, at = [], 0
        for kind, turn in parts:
            if kind != "observation":
                spans.append((at, at + len(turn)))
            at += len(turn)
        all_ids.append(np.concatenate([turn for _, turn in parts])[:tokens])
        bits = [np.full(len(turn), int(kind != "observation"), dtype=np.int64) for kind, turn in parts]
        masks.append(np.concatenate(bits)[:tokens])
        extras.append({SPANS: format_spans(clip_spans(spans, tokens))})
    return all_ids, masks, extras, environment, model


def bench_step_checks(
    name: str,
    *,
    trajectories: int = 2560,
    tokens: int = 1500,
    repeats: int = 5,
    string_path: bool = True,
    seed: int = 0,
) -> StepChecksBench:
    """Build the step, time its check `repeats` times as the sampler runs it, and once the old string path."""
    import torch

    tokenizer = load_tokenizer(name)
    ids, masks, extras, environment, model = build_step(tokenizer, trajectories, tokens, seed)
    # what TransferQueue hands the sampler: jagged nested tensors, one row a trajectory
    responses = torch.nested.nested_tensor([torch.from_numpy(i) for i in ids], layout=torch.jagged)
    response_mask = torch.nested.nested_tensor([torch.from_numpy(m) for m in masks], layout=torch.jagged)
    padding = [False] * trajectories
    started = time.perf_counter()
    strings = TokenStrings(tokenizer)
    table_s = time.perf_counter() - started
    runs, cpu_runs, metrics = [], [], {}
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        metrics = loss_step_metrics(extras, response_rows(responses, response_mask, padding), strings)
        runs.append(time.perf_counter() - started)
        cpu_runs.append(time.process_time() - cpu)
    string_s = None
    if string_path:
        started = time.perf_counter()
        rows = [
            (tokenizer.convert_ids_to_tokens(i.tolist()), m.tolist(), record_of(e))
            for i, m, e in zip(ids, masks, extras, strict=True)
        ]
        reference = mask_step_metrics(rows)
        string_s = time.perf_counter() - started
        fast = {k: metrics[k] for k in reference}
        if fast != reference:
            raise RuntimeError(
                f"the id path's counts {fast} differ from the string path's {reference}: a bug"
            )
    return StepChecksBench(
        tokenizer=describe(tokenizer, name),
        trajectories=trajectories,
        tokens=tokens,
        environment_blocks=environment,
        model_blocks=model,
        metrics=metrics,
        table_s=table_s,
        string_path_s=string_s,
        runs=runs,
        cpu_runs=cpu_runs,
    )


__all__ = ["StepChecksBench", "bench_step_checks", "build_step", "describe", "load_tokenizer"]
