"""Run a snippet of Python in SkyPilot's interpreter (`.venv-sky`): how tests drive SkyPilot's own code.

SkyPilot cannot be imported in the dev venv (its click pin clashes with verl's), so tests that replay its parser,
SkyServe's objects, its recovery strategy or its feasibility code run a script there, with this repo on the path,
and read back what it printed: its stdout, or the JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from searchrl.deploy import skypilot
from tests.conftest import REPO


def in_sky_python(
    code: str, *argv: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 120
) -> str:
    """stdout of `code` run with SkyPilot's python (argv after it); fails the test with its stderr otherwise."""
    proc = subprocess.run(
        [skypilot.sky_python(), "-c", code, *argv],
        input=stdin,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def sky_json(code: str, *argv: str, **kwargs: Any) -> dict[str, Any]:
    """The JSON object `code` printed last (as in_sky_python)."""
    out: dict[str, Any] = json.loads(in_sky_python(code, *argv, **kwargs).strip().splitlines()[-1])
    return out
