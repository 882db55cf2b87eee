"""Fixtures for trainer tests: verl's composed config, the QA fixture, and an offline Qwen-like tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from searchrl.prompt import SEARCH_TOOL_SCHEMA, build_user_prompt
from searchrl.trainer.tiny_model import CHATML_HERMES_TEMPLATE
from tests.conftest import FIXTURES, TINY_CORPUS

QA_SAMPLE = FIXTURES / "qa_train_sample.jsonl"
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


@pytest.fixture(scope="session")
def qa_sample() -> Path:
    return QA_SAMPLE


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
    from searchrl.trainer.tiny_model import build_tokenizer

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
