"""verl's separate_async trainer logs with `flush=True` when the rollout has its own pool; the patch lets it pass."""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap

import pytest


def test_pythons_logger_refuses_flush() -> None:
    """Why verl 0.9.1's line (trainer_separate_async.py:181-185) ends a hybrid_engine=False run at start-up."""
    logger = logging.getLogger("searchrl.test.unpatched")
    logger.setLevel(
        logging.INFO
    )  # verl sets VERL_LOGGING_LEVEL, default INFO; a disabled level never reaches _log
    with pytest.raises(TypeError, match="flush"):
        logger.info("x", flush=True)  # type: ignore[call-arg]


def test_verls_separate_async_logger_takes_flush_and_still_logs(caplog: pytest.LogCaptureFixture) -> None:
    from verl.trainer.ppo.v1 import trainer_separate_async

    from searchrl.trainer.patches import separate_async

    separate_async.install()
    separate_async.install()  # idempotent
    with caplog.at_level(logging.INFO, logger=separate_async.LOGGER):
        trainer_separate_async.logger.info("[V1SepAsync] hybrid replicas disabled %s", "(test)", flush=True)
    assert "[V1SepAsync] hybrid replicas disabled (test)" in caplog.text


def test_verl_still_passes_flush_to_the_separate_async_logger() -> None:
    """The pin check (trainer/patches/README.md): verl 0.9.1's `_setup` calls `logger.info(..., flush=True)`
    (trainer_separate_async.py:181-185). When a verl release drops the kwarg this fails, and the patch can go."""
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    tree = ast.parse(textwrap.dedent(inspect.getsource(PPOTrainerSeparateAsync._setup)))
    flushed = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "logger"
        and any(keyword.arg == "flush" for keyword in node.keywords)
    ]
    assert flushed == ["info"]
