"""`searchrl model bench NAME`: the local engine's tokens/s with one request at a time vs batched requests.

    searchrl model bench smollm2-135m                              # dev questions, 64 new tokens, 1 vs 16 in flight
    searchrl model bench smollm2-135m --concurrency 1,4,16 --threads 1 --max-tokens 128

Every point sends the same prompts (the searchrl eval prompt with the tool schema, ~400 tokens, as
`searchrl eval` renders it; the repo's template when the model's own drops tools) through `LocalLLM.complete`,
greedy, with `--concurrency` requests in flight. Concurrency 1 is what the engine did before it batched (one
`generate()` per request); higher values let requests that arrive together share one left-padded `generate()`.
tokens/s = tokens generated (each row up to its EOS or cap) / wall time of the point, prefill included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def bench_local(
    model: str,
    *,
    concurrencies: Sequence[int] = (1, 16),
    questions: int = 16,
    max_tokens: int = 64,
    threads: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """{"cpu", "threads", "points": [{concurrency, wall_s, generated_tokens, tokens_per_s, mean_batch}]}."""
    from searchrl.chat_template import drops_tools, prepare_chat_template
    from searchrl.infer.llm import ChatRenderer, Sampling, load_tokenizer
    from searchrl.infer.local import EngineStats, LocalLLM
    from searchrl.infer.qa import load_qa
    from searchrl.models import resolve_model
    from searchrl.prompt import build_messages
    from searchrl.retrieval.encoders.tuning import cpu_info
    from searchrl.rollout import training_tool_schemas

    path = resolve_model(model)
    tok = load_tokenizer(path)
    template = prepare_chat_template(tok, model=model, choice="searchrl" if drops_tools(tok) else "model")
    llm = LocalLLM.from_pretrained(path, tokenizer=tok, device=device, threads=threads)
    renderer = ChatRenderer(tok)
    items, _ = load_qa("dev")
    prompts = [
        renderer.initial(build_messages(items[i % len(items)].question), training_tool_schemas())
        for i in range(questions)
    ]
    sampling = Sampling(max_tokens=max_tokens)

    async def run(concurrency: int) -> None:
        sem = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> None:
            async with sem:
                await llm.complete(prompt, sampling)

        await asyncio.gather(*(one(p) for p in prompts))

    llm._generate(prompts[0], Sampling(max_tokens=2))  # warm-up: first-call allocations out of the numbers
    points = []
    for c in concurrencies:
        llm.stats = EngineStats()
        t0 = time.perf_counter()
        asyncio.run(run(c))
        wall = time.perf_counter() - t0
        s = llm.stats.as_dict()
        point = {
            "concurrency": c,
            "wall_s": round(wall, 2),
            "generated_tokens": s["generated_tokens"],
            "tokens_per_s": round(s["generated_tokens"] / wall, 2),
            "mean_batch": s["mean_batch"],
        }
        log.info("concurrency %d: %s", c, point)
        points.append(point)
    return {
        "model": model,
        "template": template,
        "cpu": cpu_info()["model"],
        "threads": llm.threads,
        "questions": questions,
        "max_tokens": max_tokens,
        "prompt_tokens_mean": round(sum(renderer.count(p) for p in prompts) / len(prompts), 1),
        "points": points,
    }


def bench_table(result: dict[str, Any]) -> str:
    """Markdown: one row per concurrency, speed-up over the first row."""
    base = result["points"][0]["tokens_per_s"] or 1.0
    lines = [
        f"{result['model']} on {result['cpu']}, {result['threads']} torch threads, {result['questions']} "
        f"prompts of ~{result['prompt_tokens_mean']:.0f} tokens, up to {result['max_tokens']} new tokens each, "
        f"greedy ({result['template']} template)",
        "",
        "| requests in flight | mean batch | tokens | wall s | tokens/s | x first row |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result["points"]:
        lines.append(
            f"| {p['concurrency']} | {p['mean_batch']:.1f} | {p['generated_tokens']} | {p['wall_s']:.1f} | "
            f"{p['tokens_per_s']:.1f} | {p['tokens_per_s'] / base:.2f} |"
        )
    return "\n".join(lines)


__all__ = ["bench_local", "bench_table"]
