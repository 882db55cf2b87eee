"""`--engine sglang`: start sglang's OpenAI-compatible server for the eval, wait until it serves, stop it after.

    searchrl eval --engine sglang --model Qwen/Qwen2.5-3B-Instruct --qa dev --retrieval-url http://127.0.0.1:8000
    SEARCHRL_INFER_SGLANG_ARGS="--mem-fraction-static 0.6 --tp 2" searchrl eval --engine sglang ...

Why a managed `python -m sglang.launch_server` subprocess rather than the offline `sglang.Engine`: the agent
already speaks `/v1/completions` (the exact training text, infer/llm.py), so the same client code runs against a
server someone else started and one we start; sglang's scheduler and detokenizer live in their own processes
either way; and the server's log goes to a file the error message points at. The process gets its own session
(process group), so stopping it also stops sglang's scheduler children. The health wait polls `GET /health`
and `GET /v1/models`, and fails at once, with the log's last lines, if the process exits first (a CUDA OOM,
a wrong model path), instead of waiting out the start-up timeout.

Flags added unless `--sglang-args` sets them already: `--sampling-defaults openai` (sglang otherwise fills every
sampling field a request leaves out from the model's generation_config.json; our requests pin them anyway, see
infer/llm.py PINNED_DECODING, so this is a second guard), `--enable-deterministic-inference` (settings
`deterministic`, on by default: greedy and seeded runs give the same tokens whatever the batch), and for
`--api chat` with a Qwen2.5/Qwen3 model `--tool-call-parser qwen` (the server parses `<tool_call>` itself). The
default command is this interpreter's `-m sglang.launch_server`, so the venv that runs searchrl runs sglang.

Needs a GPU and `sglang` installed (sky/infer.yaml installs `sglang[all]==0.5.12`); tests run the same code with
the command pointed at tests/infer/fake_sglang.py, which serves the scripted OpenAI endpoints.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from searchrl.errors import InferenceError
from searchrl.infer.llm import ServerLLM
from searchrl.processes import stop_process

log = logging.getLogger(__name__)

DEFAULT_COMMAND = f"{shlex.quote(sys.executable)} -m sglang.launch_server"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ManagedSGLang:
    """One sglang server process for one model, on a loopback port."""

    def __init__(
        self,
        model: str,
        *,
        command: str = DEFAULT_COMMAND,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 1800.0,
        log_path: Path | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path or Path(f"sglang-{self.port}.log")
        self.argv = [
            *shlex.split(command),
            "--model-path",
            model,
            "--host",
            host,
            "--port",
            str(self.port),
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("wb")
        log.info("starting sglang for %s on %s:%d (log: %s)", self.model, self.host, self.port, self.log_path)
        try:
            self.proc = subprocess.Popen(  # noqa: S603  (argv from our settings, no shell)
                self.argv, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise InferenceError(
                f"cannot start sglang ({self.argv[0]}: {exc.strerror}); install it (pip install 'sglang[all]') "
                "or set SEARCHRL_INFER_SGLANG_COMMAND"
            ) from None
        finally:
            log_file.close()

    def _tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    async def wait_ready(self, interval_s: float = 1.0) -> None:
        """Poll until /health and /v1/models answer 200; raise at once if the process dies."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        root = f"http://{self.host}:{self.port}"
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise InferenceError(
                        f"sglang exited with code {code} before serving {self.model!r}; log {self.log_path}: "
                        f"{self._tail()}"
                    )
                try:
                    health = await client.get(root + "/health")
                    models = await client.get(root + "/v1/models")
                    if health.status_code == 200 and models.status_code == 200:
                        log.info("sglang serves %s at %s", self.model, self.base_url)
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise InferenceError(
                        f"sglang did not serve {self.model!r} within {self.startup_timeout_s:g}s; raise "
                        f"SEARCHRL_INFER_SGLANG_STARTUP_TIMEOUT_S or read {self.log_path}: {self._tail()}"
                    )
                await asyncio.sleep(interval_s)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the process group (sglang's scheduler and detokenizer with it), SIGKILL it after `grace_s`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        code = stop_process(proc, grace_s)
        log.info("sglang for %s stopped (exit code %d)", self.model, code)


class ManagedServerLLM(ServerLLM):
    """The OpenAI client for a server we started: closing it stops the server."""

    def __init__(self, server: ManagedSGLang, **kwargs: object) -> None:
        super().__init__(server.base_url, server.model, **kwargs)  # type: ignore[arg-type]
        self.server = server

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await asyncio.to_thread(self.server.stop)


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def launch_flags(
    model: str, extra_args: Sequence[str], *, deterministic: bool = True, tool_call_parser: bool = False
) -> list[str]:
    """`extra_args` plus the flags the eval needs that the user did not set (module docstring)."""
    args = list(extra_args)
    if not _has_flag(args, "--sampling-defaults"):
        args += ["--sampling-defaults", "openai"]
    if deterministic and not _has_flag(args, "--enable-deterministic-inference"):
        args.append("--enable-deterministic-inference")
    name = model.rstrip("/").split("/")[-1].lower()
    is_qwen_chat = re.search(r"qwen(2\.5|3)", name) is not None and "coder" not in name
    if tool_call_parser and is_qwen_chat and not _has_flag(args, "--tool-call-parser"):
        args += ["--tool-call-parser", "qwen"]  # sglang's Qwen25Detector (hermes <tool_call> JSON)
    return args


async def start_sglang(
    model: str,
    *,
    command: str | None = None,
    extra_args: str = "",
    startup_timeout_s: float = 1800.0,
    log_dir: Path = Path("."),
    deterministic: bool = True,
    tool_call_parser: bool = False,
    **client_kwargs: object,
) -> ManagedServerLLM:
    """Start sglang for `model`, wait until it serves, and return a client whose aclose() stops it."""
    port = free_port()
    server = ManagedSGLang(
        model,
        command=command or DEFAULT_COMMAND,
        extra_args=launch_flags(
            model, shlex.split(extra_args), deterministic=deterministic, tool_call_parser=tool_call_parser
        ),
        port=port,
        startup_timeout_s=startup_timeout_s,
        log_path=log_dir / f"sglang-{port}.log",
    )
    server.start()
    try:
        await server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return ManagedServerLLM(server, **client_kwargs)


__all__ = [
    "DEFAULT_COMMAND",
    "ManagedSGLang",
    "ManagedServerLLM",
    "free_port",
    "launch_flags",
    "start_sglang",
]
