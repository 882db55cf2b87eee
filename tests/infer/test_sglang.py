"""`--engine sglang`: the launcher starts the server command, waits for health, evaluates, and stops it.

The command is tests/infer/fake_sglang.py (sglang needs a GPU): same flags, the scripted OpenAI endpoints.
Not run here: a real sglang.launch_server (GPU); sky/infer.yaml installs sglang[all]==0.5.12 for that. The flags
the launcher adds are checked against that version's own argument parser (read from its wheel).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from searchrl.cli import main
from tests.conftest import TINY_QA
from tests.infer.test_agent import MODEL


def test_the_flags_the_launcher_adds_exist_in_sglang_0_5_12(sglang_wheel: Path) -> None:
    """The stand-in accepts any flag; sglang 0.5.12's parser (srt/server_args.py) and its tool-call parser registry
    (srt/function_call/function_call_parser.py) are what a GPU run meets."""
    import zipfile

    from searchrl.infer.sglang import launch_flags

    with zipfile.ZipFile(sglang_wheel) as zf:
        server_args = zf.read("sglang/srt/server_args.py").decode()
        parsers = zf.read("sglang/srt/function_call/function_call_parser.py").decode()
    flags = launch_flags("Qwen/Qwen2.5-3B-Instruct", ["--tp-size", "2"], tool_call_parser=True)
    for flag in [f for f in flags if f.startswith("--")] + ["--model-path", "--host", "--port"]:
        assert f'"{flag}"' in server_args, flag
    assert flags[flags.index("--tool-call-parser") + 1] == "qwen" and '"qwen": Qwen25Detector' in parsers
    assert flags[flags.index("--sampling-defaults") + 1] == "openai"
    assert '"openai"' in server_args


FAKE = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).with_name('fake_sglang.py')))}"


def _argv(retrieval_url: str, tokenizer: Path, out: Path) -> list[str]:
    return [
        "eval", "--engine", "sglang", "--sglang-command", FAKE, "--sglang-args", "--mem-fraction-static 0.5",
        "--model", MODEL, "--tokenizer", str(tokenizer), "--retrieval-url", retrieval_url,
        "--qa", str(TINY_QA), "--max-turns", "2", "--output-dir", str(out),
    ]  # fmt: skip


@pytest.mark.live
def test_managed_sglang_serves_the_eval_and_is_stopped(
    live_bm25_url: str, chat_tokenizer_dir: Path, tmp_path: Path
) -> None:
    assert main(_argv(live_bm25_url, chat_tokenizer_dir, tmp_path)) == 0
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["protocol"]["engine"] == "sglang" and doc["summary"]["em"] == pytest.approx(0.6)
    (log,) = tmp_path.glob("sglang-*.log")
    first = log.read_text().splitlines()[0]
    assert f"model {MODEL}" in first and "'--mem-fraction-static', '0.5'" in first
    # OpenAI sampling defaults (no generation_config.json defaults) and token-reproducible decoding
    assert "'--sampling-defaults', 'openai', '--enable-deterministic-inference'" in first
    assert doc["protocol"]["decoding"]["deterministic_inference"] is True
    port = int(log.stem.split("-")[1])
    with pytest.raises(httpx.ConnectError):  # the server is gone once the eval is done
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.live
def test_sglang_that_dies_at_load_fails_fast_with_its_log(
    live_bm25_url: str,
    chat_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAKE_SGLANG_FAIL", "1")
    assert main(_argv(live_bm25_url, chat_tokenizer_dir, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: sglang exited with code 1 before serving") and "CUDA out of memory" in err
