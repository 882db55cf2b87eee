"""verl 0.9.1's `separate_async` trainer crashes at start-up with a standalone rollout pool only: drop one kwarg.

With `actor_rollout_ref.hybrid_engine=False` (rollout on its own GPUs or nodes, none on the trainer's: the layout
issue 40 wants) `PPOTrainerSeparateAsync._setup` logs `logger.info(..., flush=True)`
(trainer/ppo/v1/trainer_separate_async.py:181-185); `logging.Logger` takes no `flush`, so `TypeError:
Logger._log() got an unexpected keyword argument 'flush'` ends the run before step 1, on any platform. The
smallest fix is on that one logger: its `_log` drops `flush`. The logger is looked up by the module's name
(`logging.getLogger(__name__)` returns the same object), so nothing of verl's trainer is imported here and the
patch can run at `import verl` in every process; the trainer runs in verl's TaskRunner Ray actor, which imports
the `VERL_USE_EXTERNAL_MODULES` list: trainer/cpu/plugin.py imports this module on CPU, and a GPU run in
`separate_async` needs it in that list too (trainer/overrides.py).
"""

from __future__ import annotations

import logging
from typing import Any

LOGGER = "verl.trainer.ppo.v1.trainer_separate_async"
_PATCHED = "_searchrl_drops_flush"


def install() -> None:
    """Make the separate_async trainer's logger accept (and ignore) `flush=`; idempotent."""
    logger = logging.getLogger(LOGGER)
    if getattr(logger, _PATCHED, False):
        return
    log = logger._log

    def drop_flush(
        level: int, msg: object, args: Any, *rest: Any, flush: bool | None = None, **kwargs: Any
    ) -> None:
        log(level, msg, args, *rest, **kwargs)

    logger._log = drop_flush  # type: ignore[method-assign]
    setattr(logger, _PATCHED, True)


install()

__all__ = ["LOGGER", "install"]
