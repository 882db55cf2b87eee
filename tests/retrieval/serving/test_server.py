"""`searchrl serve` start-up: a port in use is refused before the index loads (issue 27 item 7)."""

from __future__ import annotations

import socket
import time

import pytest

from searchrl.cli import main


@pytest.mark.live
def test_port_in_use_is_one_line_before_the_backend_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "searchrl.retrieval.backends.build_backend", lambda _s: pytest.fail("loaded the index first")
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        assert main(["serve", "--port", str(port)]) == 2
    assert time.monotonic() - t0 < 5
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: port {port} on 127.0.0.1 is already in use (another `searchrl serve`?): stop that process or "
        "pass --port N (SEARCHRL_RETRIEVAL_PORT)"
    )
