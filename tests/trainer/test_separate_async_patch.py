"""verl's separate_async trainer logs with `flush=True` when the rollout has its own pool; the patch lets it pass."""

from __future__ import annotations

import logging

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

    from searchrl.trainer.patches import separate_async as separate_async_patch

    separate_async_patch.install()
    separate_async_patch.install()  # idempotent
    with caplog.at_level(logging.INFO, logger=separate_async_patch.LOGGER):
        trainer_separate_async.logger.info("[V1SepAsync] hybrid replicas disabled %s", "(test)", flush=True)
    assert "[V1SepAsync] hybrid replicas disabled (test)" in caplog.text
