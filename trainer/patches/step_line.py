"""verl's console step line gets an end marker, so a line Ray forwarded in pieces is put back together.

verl's trainer runs in its TaskRunner Ray actor and prints each step's metrics as one `step:N - key:value - ...`
line (utils/logger/aggregate_logger.py:49-51, `LocalLogger.log` printing `concat_dict_to_str`, 26-32). The actor's
stdout is a file that Ray's log monitor tails with `readline()` (ray/_private/log_monitor.py:401): when it reads
while the line is still being written, it forwards the part it has as a line of its own, and the rest as the next
line. A CI run lost step 16 that way ("verl logged no response_length/mean, timing_s/step", 2026-12-07), and a Ray
actor printing 11,000-character lines split 1 in 300 here. A cut can fall inside a number, so a line's keys alone
cannot tell a whole line from a cut one ("critic/score/mean:0.78" cut after the 0 still parses). With this marker
as the line's last part, trainer/step_lines.py knows a step line is whole, and joins a cut one with the pieces
that follow it from the same actor.

The patch wraps the module's `concat_dict_to_str`, which `LocalLogger.log` looks up at each call, and nothing else:
the marker is one more `key:value` part (`searchrl/line_end:1`), so any reader of verl's format still parses the
line. Every run's TaskRunner imports this module (trainer/overrides.py puts it in `VERL_USE_EXTERNAL_MODULES` on
GPU; trainer/cpu/plugin.py imports it on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# trainer/step_lines.py's LINE_END, the reader's (a Ray-room module imports nothing from the CLI's; the test that
# prints through verl's patched logger holds the two equal: tests/trainer/test_step_lines.py)
LINE_END = " - searchrl/line_end:1"
_PATCHED = "_searchrl_line_end"


def install() -> None:
    """Make verl's console step line end with LINE_END; idempotent."""
    from verl.utils.logger import aggregate_logger

    concat: Callable[..., str] = aggregate_logger.concat_dict_to_str
    if getattr(concat, _PATCHED, False):
        return

    def ended(*args: Any, **kwargs: Any) -> str:
        return concat(*args, **kwargs) + LINE_END

    setattr(ended, _PATCHED, True)
    aggregate_logger.concat_dict_to_str = ended


install()
