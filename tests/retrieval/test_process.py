"""retrieval/process.py: the one start-and-wait for child servers reports a crash or a silent port in one line."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from searchrl.errors import SearchRLError
from searchrl.retrieval.process import free_port, serve_command, start_ready, wait_until_ready

pytestmark = pytest.mark.live


def test_a_child_that_exits_during_start_up_fails_at_once_naming_its_log(tmp_path: Path) -> None:
    log_path = tmp_path / "child.log"
    cmd = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    started = time.monotonic()
    with pytest.raises(SearchRLError, match=r"exited with 3 during start-up; see .*child\.log"):
        start_ready(cmd, f"http://127.0.0.1:{free_port()}", log_path, timeout_s=60)
    assert time.monotonic() - started < 30  # it did not wait out the deadline
    assert "boom" in log_path.read_text()


def test_nothing_listening_times_out_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(SearchRLError, match=rf"no 200 from {url}/ready after 0.5s"):
        start_ready(cmd, url, tmp_path / "child.log", path="/ready", timeout_s=0.5, interval_s=0.05)
    with pytest.raises(SearchRLError, match="no 200"):
        wait_until_ready(url, timeout_s=0.2, interval_s=0.05)


def test_serve_command_runs_this_interpreter_on_loopback() -> None:
    assert serve_command(["--backend", "bm25"], 8123) == [
        sys.executable, "-m", "searchrl", "serve", "--host", "127.0.0.1", "--port", "8123", "--backend", "bm25",
    ]  # fmt: skip
