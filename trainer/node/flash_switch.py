"""FLASH_ATTN, the switch between flash-attn 2 and torch's sdpa, read in this one place.

    python3 trainer/node/flash_switch.py    # prints 1 or 0 for $FLASH_ATTN (unset: 1); a bad value: one line, exit 2

Four places act on the switch: sky/train*.yaml's setup installs flash-attn's wheel or not, the Makefile builds
train-local's venv with it or not, trainer/node/stack_check.py checks the wheel or not, and TrainSettings.flash_attn
has verl ask for `flash_attention_2` or `sdpa`. Each used to parse the variable itself, and they disagreed: the
bash regexes, the Makefile and the stack check read any value outside their off-list as on (`FLASH_ATTN=disable`
installed flash-attn) while TrainSettings refused it, and ` 0` was off to the stack check, on to the YAMLs and
refused by TrainSettings. Now the YAMLs and the Makefile run this file and read its
answer, stack_check takes the answer as an argument, and TrainSettings calls `flash_attn_on`.

The accepted words are pydantic's boolean strings, in any case, which TrainSettings always took: 1/true/t/yes/y/on
and 0/false/f/no/n/off. Anything else (the empty string and surrounding spaces included) is refused in one line.
Standard library only: setup runs it with the system python before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

NAME = "FLASH_ATTN"
ON = frozenset({"1", "true", "t", "yes", "y", "on"})
OFF = frozenset({"0", "false", "f", "no", "n", "off"})


def flash_attn_on(value: str | None) -> bool:
    """True for flash-attn 2, False for sdpa; None (unset) is the default, on. Raises ValueError (one line, which
    the caller prefixes with the variable's name, as TrainSettings' errors are) for a value that is neither, so no
    reader guesses."""
    if value is None:
        return True
    word = value.lower()
    if word in ON:
        return True
    if word in OFF:
        return False
    raise ValueError(
        f"{value!r} is not a switch: 1, true, yes, on (flash-attn 2) or 0, false, no, off (torch's sdpa), any case"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        description=f"Print 1 or 0 for ${NAME} (unset: 1), as every reader reads it."
    ).parse_args(argv)
    try:
        on = flash_attn_on(os.environ.get(NAME))
    except ValueError as exc:
        print(f"error: {NAME}: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    print(int(on))  # noqa: T201  (stdout: the answer the YAMLs and the Makefile read)
    return 0


if __name__ == "__main__":
    sys.exit(main())
