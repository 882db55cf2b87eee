"""`searchrl health URL` against real services: a good one, a stopped one, a wrong token, broken answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.responses import PlainTextResponse

from searchrl.cli import main
from tests.conftest import AUTH_TOKEN, free_port
from tests.live import healthy_app, serve_in_thread

pytestmark = pytest.mark.live

TOKEN = AUTH_TOKEN


@pytest.fixture(scope="module")
def auth_url(authed_bm25_url: str) -> str:
    return authed_bm25_url


@pytest.fixture(scope="module")
def broken_url() -> Iterator[str]:
    """A server that speaks HTTP but not the /retrieve contract (wrong shape, not JSON)."""
    app = healthy_app()

    @app.post("/retrieve")
    async def retrieve() -> dict[str, object]:
        return {"result": []}  # no inner list for the one query sent

    @app.post("/text/retrieve")
    async def text() -> PlainTextResponse:
        return PlainTextResponse("<html>proxy error</html>")

    with serve_in_thread(app) as url:
        yield url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["health", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_passes_on_a_live_service_with_the_right_answer(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    rc, out, err = run(capsys, auth_url, "--expect", "Seventh Seal", "--deadline", "10")
    assert rc == 0, err
    assert out.startswith(f"{auth_url}: ok: 3 passages") and "The Seventh Seal" in out
    assert TOKEN not in out + err


def test_token_from_a_named_variable(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_TOKEN", TOKEN)
    assert run(capsys, auth_url, "--api-key-env", "MY_TOKEN")[0] == 0
    rc, _, err = run(capsys, auth_url, "--api-key-env", "not a name!")
    assert rc == 2 and "takes an environment variable NAME" in err


def test_wrong_token_fails_at_once_with_401(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", "wrong-token")
    started = time.monotonic()
    rc, out, err = run(capsys, auth_url, "--deadline", "30")
    assert rc == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {auth_url}: unauthorized (401)")
    assert "wrong-token" not in err
    assert time.monotonic() - started < 5  # a 401 cannot get better by waiting


def test_stopped_service_fails_fast_as_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    rc, _, err = run(capsys, url, "--deadline", "1.5")
    assert rc == 75  # an outage (EX_TEMPFAIL), not a refusal: trainer/node/refusal.py never counts it
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {url}: unreachable")
    assert time.monotonic() - started < 6


def test_wrong_shape_and_malformed_bodies_fail(broken_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, broken_url, "--deadline", "3")
    assert rc == 2 and err.startswith(f"error: {broken_url}: malformed response")
    rc, _, err = run(capsys, broken_url + "/text", "--deadline", "3")
    assert rc == 2 and "malformed response" in err and len(err.strip().splitlines()) == 1


def test_a_wrong_answer_fails(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    rc, _, err = run(capsys, auth_url, "--expect", "Zzyzx Road")
    assert rc == 2 and "wrong answer: no passage contains 'Zzyzx Road'" in err


def test_each_url_of_a_failover_list_must_pass(
    auth_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    dead = f"http://127.0.0.1:{free_port()}"
    rc, out, err = run(capsys, f"{auth_url},{dead}", "--deadline", "1")
    assert rc == 75 and out.startswith(f"{auth_url}: ok") and f"error: {dead}: unreachable" in err
