"""Fixtures for trainer tests: verl's composed config, the QA fixture, an offline Qwen-like tokenizer. The CLI runs of
verl started side by side are tests/trainer/e2e/'s (its conftest and runs.py)."""

from __future__ import annotations

import json
import queue as queue_module
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from searchrl.prompt import SEARCH_TOOL_SCHEMA, build_user_prompt
from searchrl.trainer.cpu.tiny_model import CHATML_HERMES_TEMPLATE
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings
from tests.conftest import QA_SAMPLE, TINY_CORPUS

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


def worker_env_vars(compose: Callable[[list[str]], Any], settings: TrainSettings) -> dict[str, str]:
    """The env vars a Ray worker of the rendered run starts with, as verl's main_ppo merges them."""
    from omegaconf import OmegaConf
    from ray.runtime_env import RuntimeEnv
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    cfg = compose(render_overrides(settings))
    extra = cfg.ray_kwargs.get("ray_init", {}).get("runtime_env", {})
    merged = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(cfg), extra))
    return dict(RuntimeEnv(**merged).env_vars())
