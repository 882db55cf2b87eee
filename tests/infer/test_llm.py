"""The LLM start-up check: a dead port fails in seconds; waiting for a loading server is explicit and bounded."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
import pytest

from searchrl.cli import main
from searchrl.errors import InferenceError
from searchrl.infer.llm import ServerLLM
from tests.conftest import free_port


def _llm(handler: object) -> ServerLLM:
    llm = ServerLLM("http://llm.test/v1", "m")
    llm._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]
    return llm


def test_refused_connection_fails_at_once_without_retries() -> None:
    calls: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        raise httpx.ConnectError("Connection refused", request=request)

    t0 = time.monotonic()
    with pytest.raises(InferenceError) as info:
        asyncio.run(_llm(refuse).check_model())
    assert time.monotonic() - t0 < 1 and calls == ["http://llm.test/v1/models"]
    assert str(info.value) == (
        "LLM server http://llm.test/v1 is not answering: cannot connect (ConnectError); start sglang/vLLM "
        "there or set --llm-url (pass --wait-for-llm SECONDS while it loads)"
    )


def test_wait_polls_a_loading_server_with_progress(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([503, 503, 200])

    def loading(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        return httpx.Response(
            status, json={"data": [{"id": "m"}]} if status == 200 else {"detail": "loading"}
        )

    with caplog.at_level(logging.INFO):
        asyncio.run(_llm(loading).check_model(wait_s=5, poll_s=0.01))
    assert "waiting for the LLM server at http://llm.test/v1 (HTTP 503" in caplog.text


def test_wait_is_bounded() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    t0 = time.monotonic()
    with pytest.raises(InferenceError, match=r"gave up after --wait-for-llm 0.2\)"):
        asyncio.run(_llm(refuse).check_model(wait_s=0.2, poll_s=0.05))
    assert time.monotonic() - t0 < 2


@pytest.mark.live
def test_eval_against_a_dead_port_exits_2_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nothing listens here: the connection is refused
    argv = ["eval", "--no-search", "--qa", "dev", "--limit", "1", "--output-dir", str(tmp_path)]
    t0 = time.monotonic()
    assert main([*argv, "--llm-url", f"http://127.0.0.1:{port}/v1"]) == 2
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"error: LLM server http://127.0.0.1:{port}/v1 is not answering: cannot connect"
    )
