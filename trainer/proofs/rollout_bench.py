"""`make bench-rollout`: one GRPO turn through the `hf` rollout engine, before and after batching (issue 32).

A CPU training step spends most of its rollout time in the model's turn after the scripted search: every
trajectory of the step asks for it at about the same time. This times that turn for `sequences` trajectories
built the way the CPU runs build them (the repo's ChatML/hermes template with the tool schema, a dev question,
the scripted call, two bundled passages as the tool response), two ways, on the same weights:

- **one at a time** (the engine before issue 32): one sequence per `generate`, 1 torch thread, then a second
  full forward for the log-probs;
- **batched** (`HFGenerateServer` now): the concurrent turns in one left-padded `generate` on all cores, the
  log-probs taken from the sampling pass's logits.

Each prompt is unique (no cache of any kind is involved) and sampling runs at T=1 as training does, so token
counts differ between the two runs: tokens per second is the figure to compare. The table names the CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from verl.workers.rollout.replica import TokenOutput

from searchrl.chat_template import use_repo_template
from searchrl.prompt import build_messages, format_passages
from searchrl.rollout import training_tool_schemas
from searchrl.trainer.cpu.hf_rollout import HFGenerateServer, sampled_log_probs
from searchrl.trainer.cpu.scripted_agent_loop import scripted_tool_call


@dataclass
class BenchPoint:
    engine: str
    sequences: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def turn_prompts(tokenizer: object, qa_path: Path, n: int) -> list[list[int]]:
    """`n` model-turn prompts: question, scripted search call, two bundled passages as the tool response."""
    from searchrl.retrieval.bundled import iter_bundled

    questions = [json.loads(line)["question"] for line in qa_path.read_text(encoding="utf-8").splitlines()]
    passages = [p.contents for p in itertools.islice(iter_bundled(), 2 * n)]
    prompts = []
    for i in range(n):
        question = questions[i % len(questions)]
        messages = [
            *build_messages(question),
            {"role": "assistant", "content": scripted_tool_call(question)},
            {"role": "tool", "content": format_passages(passages[2 * i : 2 * i + 2], max_chars_per_doc=200)},
        ]
        ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            messages, tools=training_tool_schemas(), add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def one_at_a_time(server: HFGenerateServer, prompts: list[list[int]], max_tokens: int) -> BenchPoint:
    """The engine before issue 32: batch 1, one thread, a second forward for the log-probs."""
    torch.set_num_threads(1)
    started, tokens = time.perf_counter(), 0
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = server.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=1.0,
                eos_token_id=server.tokenizer.eos_token_id,
                pad_token_id=server.pad_id,
            )
            new = out[0, len(prompt) :].tolist()
            logits = server.model(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]
            sampled_log_probs(logits, torch.tensor(new), 1.0)
            tokens += len(new)
    return BenchPoint(
        "one at a time, 1 thread, 2nd forward", len(prompts), tokens, time.perf_counter() - started
    )


def batched(server: HFGenerateServer, prompts: list[list[int]], threads: int) -> BenchPoint:
    """The engine now: the turns sent concurrently, as verl's agent loop sends them."""
    torch.set_num_threads(threads)

    async def turn() -> list[TokenOutput]:
        return await asyncio.gather(
            *[server.generate(str(i), p, {"temperature": 1.0}) for i, p in enumerate(prompts)]
        )

    started = time.perf_counter()
    outs = asyncio.run(turn())
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outs)
    return BenchPoint(f"batched, {threads} threads, sampling-pass log-probs", len(prompts), tokens, seconds)


def bench_rollout(
    model_dir: Path, qa_path: Path, *, sequences: int = 8, max_tokens: int = 64
) -> list[BenchPoint]:
    threads = len(os.sched_getaffinity(0))
    server = HFGenerateServer(
        str(model_dir), prompt_length=4096, response_length=max_tokens, max_batch=sequences, threads=threads
    )
    use_repo_template(server.tokenizer, model=str(model_dir))
    prompts = turn_prompts(server.tokenizer, qa_path, sequences)
    return [one_at_a_time(server, prompts, max_tokens), batched(server, prompts, threads)]


def bench_table(points: list[BenchPoint], cpu: str) -> str:
    base = points[0].tokens_per_s
    lines = [
        f"one GRPO model turn, {points[0].sequences} trajectories, on {cpu}",
        "| engine | sequences | tokens | seconds | tokens/s | vs before |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        ratio = p.tokens_per_s / base if base else float("nan")
        lines.append(
            f"| {p.engine} | {p.sequences} | {p.tokens} | {p.seconds:.1f} | {p.tokens_per_s:.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


__all__ = ["BenchPoint", "bench_rollout", "bench_table", "turn_prompts"]
