"""The end-to-end runs: verl's loop driven through the CLI as a user runs it (`make train-cpu`, `make learn-cpu`,
`make learn-search` and their sabotages). The session starts every run its selected tests read as soon as it has
collected, niced, two at a time (`pytest_collection_finish`); the tests that read them run after every other test but
the quiet ones (tests/conftest.py), so the runs go on beside the unit tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import SESSION_RUNS
from tests.trainer.e2e.runs import (
    SESSION_MAX_RUNNING,
    SESSION_NICE,
    TRAIN_CPU_RUNS,
    CliRuns,
    PlannedRun,
    planned_runs,
    plans_runs,
    selected,
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start every planned run as soon as the session has collected, niced, two at a time, so the verl runs go on
    beside the ~1,500 unit tests that run before the tests reading them (issue 52: `make test` ran them only when
    their first reader came, in the last third of the session, and waited ~18 of its 38 minutes on them; a unit
    test keeps ~one core of two busy). Nothing starts for `--collect-only` or a session that selects no reader."""
    if session.config.option.collectonly:
        return
    plans = planned_runs(session)
    if not plans:
        return
    root = Path(tempfile.mkdtemp(prefix="searchrl-cli-runs-"))
    runs = CliRuns(root, max_running=SESSION_MAX_RUNNING, nice=SESSION_NICE)
    session.config.stash[SESSION_RUNS] = runs
    for plan in plans:
        runs.start(plan.key, plan.args, plan.env, python=plan.python)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop what a failed or interrupted session left running; keep the runs' folder (logs) unless it passed."""
    runs = session.config.stash.get(SESSION_RUNS, None)
    if runs is not None:
        runs.stop()
        if exitstatus == 0:
            shutil.rmtree(runs.root, ignore_errors=True)


@pytest.fixture(scope="session")
def session_runs(request: pytest.FixtureRequest) -> CliRuns:
    """The runs `pytest_collection_finish` started for this session's readers, keyed as their planners named them."""
    runs = request.config.stash.get(SESSION_RUNS, None)
    if runs is None:
        pytest.fail("no CLI run was planned for this test: mark it cli_run(NAME) and plan NAME (plans_runs)")
    return runs


@plans_runs
def plan_train_cpu_runs(session: pytest.Session) -> list[PlannedRun]:
    """`make train-cpu` in sync (test_train_cpu.py) and in colocate_async (test_train_cpu_async.py), the ones this
    session selected, keyed by mode; ranked 1 and 3, between the learning runs' (test_learn.py), so that a run on
    our hf engine, lighter in memory, goes beside each run on verl's vLLM server."""
    return [
        PlannedRun(rank=1 + 2 * i, key=mode, args=["train", "cpu", *flags])
        for i, (mode, flags) in enumerate(TRAIN_CPU_RUNS.items())
        if selected(session, f"train-cpu {mode}")
    ]


@pytest.fixture(scope="session")
def train_cpu_runs(session_runs: CliRuns) -> CliRuns:
    return session_runs
