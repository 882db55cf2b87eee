"""`make bench-rollout` (trainer/proofs/rollout_bench.py): the vLLM levers' workloads, the JSON hand-off to the child
process (a fake child here: the real one needs the CPU vLLM venv and minutes), its failure and timeout rows, the
table, the final line and the verb's flags. Seconds; the measurement itself is docs/cpu-proofs.md's."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.trainer.proofs import rollout_bench as bench
from searchrl.trainer.proofs.rollout_bench import HF, VLLM, BenchPoint, VllmSetting, Workload

UNIQUE = [[i] * (10 + i) for i in range(32)]  # 32 distinct "prompts" of 10..41 tokens


def fake_python(tmp_path: Path, body: str) -> Path:
    """An executable that stands in for the CPU vLLM venv's python: `-m <module> --spec S --out O`, then `body`."""
    script = tmp_path / "fake-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        "args = sys.argv[1:]\n"
        "spec = json.load(open(args[args.index('--spec') + 1]))\n"
        "out = args[args.index('--out') + 1]\n" + body
    )
    script.chmod(0o755)
    return script


# answers every workload as the real child does, and records its environment beside the spec
ANSWER_ALL = """
json.dump({k: v for k, v in os.environ.items() if k.startswith("VLLM_")}, open(out + ".env", "w"))
result = {"engine_s": 1.0, "start_s": 2.5, "workloads": []}
for w in spec["workloads"]:
    result["workloads"].append({"label": w["label"], "sequences": len(w["prompts"]),
        "prompt_tokens": sum(map(len, w["prompts"])), "new_tokens": 10 * len(w["prompts"]),
        "seconds": 2.0, "first_pass_s": 3.0, "passes_tokens_per_s": [40.0, 35.0], "load": 1.5})
json.dump(result, open(out, "w"))
"""


def test_each_setting_runs_its_workloads_and_grpo_shares_prompts_as_verl_repeats_them():
    eager = bench.DEFAULT_SETTINGS[0]
    rows = [(w.sequences, w.label, eager.mode(w)) for w in eager.workloads(8)]
    assert rows == [
        (8, "unique", "eager, prefix caching on, not read"),
        (16, "unique", "eager, prefix caching on, not read"),
        (8, "shared: 2 prompts x 4", "eager, prefix caching on, not read"),
        (8, "unique", "eager, prefix caching on"),
        (8, "shared: 2 prompts x 4", "eager, prefix caching on"),
    ]
    assert [w.label for w in eager.workloads(3)] == ["unique", "unique", "unique"]  # no 2 x n/2 for an odd n
    off = VllmSetting(enforce_eager=False, prefix_caching=False, runs=(("n", True),))
    assert [off.mode(w) for w in off.workloads(8)] == ["compiled, prefix caching off"]
    assert Workload(2, 3).build(UNIQUE) == [UNIQUE[0]] * 3 + [UNIQUE[1]] * 3  # each prompt's samples together
    assert Workload(8).build(UNIQUE) == UNIQUE[:8]
    engines = [s.engine for s in bench.FULL_SETTINGS]
    assert engines == ["eager-cache-on", "eager-cache-off", "compiled-cache-on"]
    assert {s.engine for s in bench.DEFAULT_SETTINGS} < set(engines)


def test_the_spec_sizes_the_engine_for_its_largest_workload(tmp_path):
    setting = VllmSetting(
        enforce_eager=False, prefix_caching=True, runs=(("n", False), ("4n", False), ("1xn", True))
    )
    spec = bench.vllm_spec(tmp_path, "bfloat16", setting, UNIQUE, 8, 64)
    assert spec["max_num_seqs"] == 32 and spec["max_model_len"] == 41 + 64 and spec["repeats"] == 1
    assert (spec["enforce_eager"], spec["enable_prefix_caching"], spec["dtype"]) == (False, True, "bfloat16")
    assert [(w["label"], len(w["prompts"]), w["max_tokens"], w["read_cache"]) for w in spec["workloads"]] == [
        ("unique", 8, 64, False),
        ("unique", 32, 64, False),
        ("shared: 1 prompt x 8", 8, 64, True),
    ]
    json.dumps(spec)  # it goes to the child as JSON


def test_the_child_gets_the_spec_as_json_and_its_json_becomes_rows(tmp_path):
    setting = bench.DEFAULT_SETTINGS[0]
    spec = bench.vllm_spec(tmp_path, "bfloat16", setting, UNIQUE, 8, 64)
    points = bench.run_vllm(fake_python(tmp_path, ANSWER_ALL), spec, setting.engine, tmp_path, timeout_s=60)
    assert [(p.engine, p.sequences, p.prompts, p.tokens, p.mode) for p in points] == [
        (VLLM, 8, "unique", 80, "eager, prefix caching on, not read"),
        (VLLM, 16, "unique", 160, "eager, prefix caching on, not read"),
        (VLLM, 8, "shared: 2 prompts x 4", 80, "eager, prefix caching on, not read"),
        (VLLM, 8, "unique", 80, "eager, prefix caching on"),
        (VLLM, 8, "shared: 2 prompts x 4", 80, "eager, prefix caching on"),
    ]
    first = points[0]
    assert (first.start_s, first.seconds, first.first_pass_s, first.error) == (2.5, 2.0, 3.0, None)
    assert (first.passes, first.load) == ((40.0, 35.0), 1.5)
    assert first.prompt_tokens == sum(len(p) for p in UNIQUE[:8]) and first.tokens_per_s == 40.0
    env = json.loads((tmp_path / "out-eager-cache-on.json.env").read_text())
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))  # a scratch cache, never ~/.cache/vllm
    assert env["VLLM_CPU_KVCACHE_SPACE"] and env["VLLM_CPU_OMP_THREADS_BIND"].startswith("0-")


def test_a_child_that_fails_before_its_engine_is_up_is_one_failed_row_with_its_last_line(tmp_path):
    spec = bench.vllm_spec(tmp_path, "float32", bench.FULL_SETTINGS[2], UNIQUE, 8, 16)
    child = fake_python(
        tmp_path, "print('compiling...')\nprint('RuntimeError: inductor said no')\nsys.exit(3)\n"
    )
    [point] = bench.run_vllm(child, spec, "compiled-cache-on", tmp_path, timeout_s=60)
    assert point.error is not None and point.start_s is None and point.tokens == 0
    assert point.mode == "compiled, prefix caching on, not read" and point.sequences == 8
    assert point.error.startswith("exit 3: RuntimeError: inductor said no before the engine was up, ")


def test_a_timeout_keeps_the_rows_done_and_kills_the_childs_process_group(tmp_path):
    setting = VllmSetting(enforce_eager=True, prefix_caching=True, runs=(("n", False), ("2xhalf", True)))
    spec = bench.vllm_spec(tmp_path, "bfloat16", setting, UNIQUE, 8, 64)
    body = (
        "import subprocess\n"
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(out + '.pid', 'w').write(str(grandchild.pid))\n"
        "w = spec['workloads'][0]\n"
        "json.dump({'start_s': 4.0, 'workloads': [{'label': w['label'], 'sequences': 8, 'prompt_tokens': 99,\n"
        "    'new_tokens': 64, 'seconds': 1.0, 'first_pass_s': 1.5}]}, open(out, 'w'))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    points = bench.run_vllm(
        fake_python(tmp_path, body), spec, "eager, prefix caching on", tmp_path, timeout_s=3
    )
    assert time.monotonic() - started < 30
    assert [(p.prompts, p.tokens, p.error) for p in points] == [
        ("unique", 64, None),
        ("shared: 2 prompts x 4", 0, "stopped at the 3 s timeout"),
    ]
    assert points[1].start_s == 4.0
    grandchild = int(next(tmp_path.glob("out-*.json.pid")).read_text())
    for _ in range(50):  # the kernel reaps it soon after SIGKILL; its parent died too, so init does
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the engine's own child {grandchild} outlived the timeout")


def _points() -> list[BenchPoint]:
    """Two engines, batched hf before, between and after them: 25, 16.7 and 30 tokens/s."""
    eager, compiled = (
        20.0,
        22.0,
    )  # 1,000 tokens in 50 s around the eager engine; 1,100 in 50 s around the compiled
    return [
        BenchPoint(HF, "one at a time, 1 thread, 2nd forward", 8, 300, 60.0, 4600, start_s=1.0, load=2.0),
        BenchPoint(HF, "batched, 2 threads (before vLLM)", 8, 500, 20.0, 4600, start_s=1.0, load=2.5),
        BenchPoint(
            VLLM,
            "eager, prefix caching on, not read",
            8,
            480,
            8.0,
            4600,
            start_s=180.0,
            first_pass_s=30.0,
            baseline=eager,
            load=3.25,
            passes=(60.0, 50.0),
        ),
        BenchPoint(
            VLLM,
            "eager, prefix caching on",
            8,
            400,
            4.0,
            4700,
            "shared: 2 prompts x 4",
            170.0,
            9.0,
            read_cache=True,
            baseline=eager,
        ),
        BenchPoint(VLLM, "eager, prefix caching on", 8, 560, 7.0, 4600, read_cache=True, baseline=eager),
        BenchPoint(HF, "batched, 2 threads (after eager-cache-on)", 8, 500, 30.0, 4600, start_s=1.0),
        BenchPoint(VLLM, "compiled, prefix caching on, not read", 8, 616, 8.0, 4600, baseline=compiled),
        BenchPoint(
            VLLM,
            "compiled, prefix caching on, not read",
            16,
            0,
            0.0,
            9200,
            error="stopped at the 900 s timeout",
            baseline=compiled,
        ),
        BenchPoint(HF, "batched, 2 threads (after compiled-cache-on)", 8, 600, 20.0, 4600, start_s=1.0),
    ]


def test_each_vllm_row_divides_by_the_hf_runs_around_its_engine_and_shared_prompts_show():
    lines = bench.bench_table(_points(), "TITLE").splitlines()
    assert lines[0] == "TITLE" and lines[2].startswith(
        "| engine | mode | sequences | prompt tokens | new tokens |"
    )
    assert lines[2].endswith("| tokens/s | vs batched hf | load |")
    # hf rows divide by all batched hf runs: 1,600 tokens in 70 s = 22.9 tokens/s
    assert (
        "| hf | batched, 2 threads (before vLLM) | 8 | 4,600 | 500 | 1.0 | 20.0 | 25.0 | 1.09x | 2.5 |"
        in lines
    )
    assert (
        "| vLLM | eager, prefix caching on, not read | 8 | 4,600 | 480 | 180.0 | 8.0 | 60.0 | 3.00x | 3.2 |"
        in lines
    )
    assert (
        "| vLLM | eager, prefix caching on, **shared: 2 prompts x 4** | 8 | 4,700 | 400 | 170.0 | 4.0 | 100.0 | "
        "5.00x | - |" in lines
    )
    assert (
        "| vLLM | compiled, prefix caching on, not read | 8 | 4,600 | 616 | - | 8.0 | 77.0 | 3.50x | - |"
        in lines
    )
    assert (
        "| vLLM | compiled, prefix caching on, not read | 16 | 9,200 | - | - | - | failed | - | - |" in lines
    )
    assert "- vLLM compiled, prefix caching on, not read, 16 sequences: stopped at the 900 s timeout" in lines
    assert (
        "- vLLM eager, prefix caching on, not read, 8 sequences: untimed first pass 30.0 s; timed passes 60.0, 50.0 "
        "tokens/s" in lines
    )


def test_the_final_line_is_the_row_furthest_ahead_on_unique_prompts_without_cache_reads():
    line = bench.final_line(_points(), "Intel(R) Xeon(R) Processor (2 cores)")
    # the rows that read the prefix cache are 4-5x; they hit the template or a shared prompt, so they are no headline
    assert line == (
        "rollout: vLLM 77.0 tokens/s (compiled, prefix caching on, not read) vs hf 22.0 tokens/s (batched, the runs "
        "around that engine) (3.5x), 8 unique prompts, on Intel(R) Xeon(R) Processor (2 cores)"
    )
    hf_only = [p for p in _points() if p.engine == HF]
    assert bench.final_line(hf_only, "X").startswith("rollout: no vLLM result; hf 22.9 tokens/s")


def test_the_verb_passes_its_flags_and_prints_the_table_and_the_line(capsys, monkeypatch, tmp_path):
    seen: dict[str, object] = {}

    def fake_bench(model_dir, qa_path, **kwargs):
        seen.update(kwargs, model_dir=model_dir)
        return _points()

    monkeypatch.setattr(bench, "bench_rollout", fake_bench)
    monkeypatch.setattr("searchrl.models.resolve_model", lambda name: str(tmp_path))
    assert (
        main(
            ["train", "bench-rollout", "m", "--no-vllm", "--precision", "fp32", "--full", "--sequences", "4"]
        )
        == 0
    )
    assert seen["vllm_python"] is None and seen["dtype"] == "float32" and seen["sequences"] == 4
    assert seen["settings"] == bench.FULL_SETTINGS and seen["timeout_s"] == 1200.0 and seen["repeats"] == 2
    out = capsys.readouterr().out.splitlines()
    assert "float32 (fp32 as asked)" in out[0] and "load average" in out[0]
    assert out[-1].startswith("rollout: vLLM 77.0 tokens/s")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--vllm-python", "./no-such-python"],
            "error: --vllm-python no-such-python: no such interpreter; run ",
        ),
        (["--engine-timeout", "0"], "error: --engine-timeout 0.0: give seconds above 0"),
        (
            ["--repeats", "0"],
            "error: --sequences and --max-tokens must be positive, and --repeats at least 1",
        ),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "bench-rollout", "./no-model", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


def test_the_bench_runs_batched_hf_around_each_engine(monkeypatch, tmp_path):
    """hf before the first engine and after each; a row's baseline is the pair around its engine."""
    hf_runs = iter([(500, 20.0), (500, 30.0), (600, 20.0)])
    order: list[str] = []

    class FakeServer:
        tokenizer = object()

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    def fake_batched(server, prompts, threads, when, repeats):
        order.append(f"hf {when}")
        tokens, seconds = next(hf_runs)
        return BenchPoint(HF, f"batched ({when})", len(prompts), tokens, seconds)

    def fake_run_vllm(python, spec, name, workdir, timeout_s):
        order.append(name)
        return [BenchPoint(VLLM, w["mode"], len(w["prompts"]), 100, 1.0) for w in spec["workloads"]]

    monkeypatch.setattr(bench, "HFGenerateServer", FakeServer)
    monkeypatch.setattr(bench, "use_repo_template", lambda tokenizer, model: None)
    monkeypatch.setattr(bench, "turn_prompts", lambda tokenizer, qa, n: UNIQUE[:n])
    monkeypatch.setattr(bench, "one_at_a_time", lambda server, prompts, n: BenchPoint(HF, "one", 8, 1, 1.0))
    monkeypatch.setattr(bench, "batched", fake_batched)
    monkeypatch.setattr(bench, "run_vllm", fake_run_vllm)
    settings = bench.FULL_SETTINGS[1:]
    points = bench.bench_rollout(tmp_path, tmp_path, vllm_python=tmp_path / "python", settings=settings)
    assert order == [
        "hf before vLLM",
        "eager-cache-off",
        "hf after eager-cache-off",
        "compiled-cache-on",
        "hf after compiled-cache-on",
    ]
    baselines = {p.mode: p.baseline for p in points if p.engine == VLLM}
    assert baselines == {
        "eager, prefix caching off": 20.0,
        "compiled, prefix caching on, not read": 22.0,
        "compiled, prefix caching on": 22.0,
    }
    assert all(p.start_s is not None for p in points if p.engine == HF)  # the model load
