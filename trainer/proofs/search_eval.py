"""`make learn-search`'s evaluation: the user's own `searchrl eval` and `searchrl compare`, on a served model.

Each model (the base weights, then the merged trained ones) is served by vLLM's OpenAI server from the CPU vLLM
venv (`vllm serve`, bf16 where the run is bf16, eager mode, a small KV cache), behind the environment's proxy
(trainer/proofs/search_env.py: the same two scripted openings training had). Then `searchrl eval` (a
subprocess, the CLI a user runs, completions API with the repo's chat template, as training renders prompts)
asks each question set with search on and with search off under training's rules (turns, top-k, passage
length, per-turn tokens), and `searchrl compare` writes the Markdown and HTML report with Wilson intervals and
paired McNemar tests against the base model with search. Measured on 2 cores (issue 52 item 3): vLLM serves a
135M model after 1-3 minutes of start-up, then 60 questions take well under a minute, where the local hf engine
runs one sequence at a time (DESIGN.md 5d).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import SmokeCheckError

log = logging.getLogger(__name__)

KV_CACHE_GIB = 2
MAX_NUM_SEQS = 32
MAX_MODEL_LEN = 2048
READY_S = 900.0  # vLLM's start on 2 busy cores took 2-4 minutes in the runs of 2026-12-07
EVAL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Rules:
    """The eval's rules, training's own (the run passes them from its settings)."""

    max_turns: int
    topk: int
    passage_max_chars: int
    turn_tokens: int
    max_response_tokens: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group it leads (vLLM spawns its engine core), SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _wait(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SmokeCheckError(
                f"{log_path.stem} exited {proc.returncode} before it was ready (log: {log_path})"
            )
        try:
            if requests.get(url, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(2)
    raise SmokeCheckError(f"{log_path.stem} not ready after {timeout_s:.0f} s (log: {log_path})")


def vllm_bin() -> Path:
    """`vllm` beside this interpreter (the CPU vLLM venv's); the run refuses to start without it."""
    return Path(sys.executable).with_name("vllm")


@contextmanager
def served_model(
    model_dir: Path,
    name: str,
    dtype: str,
    logs: Path,
    scratch: Path,
    *,
    close_answer: bool = False,
    close_query: bool = False,
    answer_tokens: int | None = None,
) -> Iterator[str]:
    """`vllm serve model_dir` plus the environment's proxy in front of it; yields the proxy's /v1 URL.
    `close_answer`, `close_query`: the proxy ends the answer turn, the query turn, as training's environment does
    (search_env.closed_answer, search_env.query_closing); `answer_tokens`: the answer
    turn's cap (search_env.answer_budget)."""
    vllm_port, proxy_port = _free_port(), _free_port()
    cores = os.cpu_count() or 1
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "VLLM_CONFIG_ROOT": str(scratch / "vllm-config"),
    }
    server = _start(
        [
            str(vllm_bin()),
            "serve",
            str(model_dir),
            "--served-model-name",
            name,
            "--dtype",
            dtype,
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--host",
            "127.0.0.1",
            "--port",
            str(vllm_port),
            "--seed",
            "0",
        ],  # fmt: skip
        logs / f"vllm-{name}.log",
        env,
    )
    proxy = _start(
        [
            sys.executable,
            "-m",
            "searchrl.trainer.proofs.search_proxy",
            "--upstream",
            f"http://127.0.0.1:{vllm_port}",
            "--port",
            str(proxy_port),
            *(["--close-answer"] if close_answer else []),
            *(["--close-query-tokenizer", str(model_dir)] if close_query else []),
            *(["--answer-tokens", str(answer_tokens)] if answer_tokens else []),
        ],  # fmt: skip
        logs / f"proxy-{name}.log",
    )
    try:
        started = time.monotonic()
        _wait(f"http://127.0.0.1:{vllm_port}/health", server, logs / f"vllm-{name}.log", READY_S)
        _wait(f"http://127.0.0.1:{proxy_port}/openings", proxy, logs / f"proxy-{name}.log", 60)
        log.info("vLLM serves %s (%s) after %.0f s", name, dtype, time.monotonic() - started)
        yield f"http://127.0.0.1:{proxy_port}/v1"
    finally:
        _stop(proxy)
        _stop(server)


def run_eval(
    *,
    llm_url: str,
    name: str,
    tokenizer: Path,
    retrieval_url: str,
    qa: Path,
    label: str,
    search: bool,
    rules: Rules,
    out_dir: Path,
    log_path: Path,
) -> Path:
    """`searchrl eval` of one question set (module docstring); the result JSON it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.json"))
    cmd = [
        sys.executable, "-m", "searchrl", "eval", "--engine", "server", "--api", "completions",
        "--llm-url", llm_url, "--model", name, "--tokenizer", str(tokenizer), "--chat-template", "searchrl",
        "--retrieval-url", retrieval_url, "--qa", str(qa), "--label", label,
        "--max-turns", str(rules.max_turns), "--topk", str(rules.topk),
        "--passage-max-chars", str(rules.passage_max_chars), "--max-tokens-per-turn", str(rules.turn_tokens),
        "--max-response-tokens", str(rules.max_response_tokens), "--temperature", "0",
        "--output-dir", str(out_dir), *([] if search else ["--no-search"]),
    ]  # fmt: skip
    started = time.monotonic()
    with open(log_path, "ab") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=EVAL_TIMEOUT_S, check=False)
    found = sorted(set(out_dir.glob("*.json")) - before)
    if code.returncode != 0 or not found:
        raise SmokeCheckError(f"searchrl eval ({label}) exited {code.returncode} (log: {log_path})")
    log.info("eval %s: %.0f s", label, time.monotonic() - started)
    return found[-1]


def run_compare(results: Sequence[Path], baseline: str, out_dir: Path, title: str, log_path: Path) -> str:
    """`searchrl compare` over the result files: its printed table; the report lands in `out_dir`."""
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "searchrl", "compare", *map(str, results), "--baseline", baseline,
        "--out", str(out_dir), "--title", title, "--allow-question-diff",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    log_path.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise SmokeCheckError(f"searchrl compare exited {proc.returncode} (log: {log_path})")
    return proc.stdout


def load_records(result: Path) -> dict[str, dict[str, Any]]:
    """The result file's per-question records, by question text."""
    doc = json.loads(result.read_text(encoding="utf-8"))
    return {str(r["question"]): r for r in doc["questions"]}


__all__ = [
    "Rules",
    "load_records",
    "run_compare",
    "run_eval",
    "served_model",
    "vllm_bin",
]
