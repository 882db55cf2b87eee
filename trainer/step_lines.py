"""verl's step lines, whole again after Ray forwarded one in pieces.

Ray's log monitor can forward one printed line as two or more (trainer/patches/step_line.py says when), each
behind the actor's prefix (`(TaskRunner pid=12) `, coloured on a terminal, `, ip=...` on another node), with
other actors' lines possibly between them. Every run we launch ends verl's step line with LINE_END (the patch), so
`StepLines` knows a whole one: a step line without it is held, and the next lines of the same actor are appended
to it until it ends. Only a step line is ever held, and only until its actor's next line, so the supervisor's
per-step check waits no longer than the step line itself took to arrive.

A line that still lacks the end when its actor starts another step line, or prints one that does not complete it,
or the output ends, is handed on as it is: the step checks then name the metrics it is missing, as before, rather
than a cut number passing for a whole one.
"""

from __future__ import annotations

import re

LINE_END_KEY = "searchrl/line_end"
LINE_END = f" - {LINE_END_KEY}:1"
# Ray's prefix on a forwarded line, `(Name pid=N[, ip=...]) `, with or without its ANSI colour
_PREFIX = re.compile(r"^((?:\x1b\[[0-9;]*m)?\([^()\n]*pid=\d+[^()\n]*\)(?:\x1b\[[0-9;]*m)? ?)")
# the same test as step_checks' reader: a `step:N - ` anywhere after a start, a space or a dump's `.jsonl`
_STEP = re.compile(r"(?:^|\s|\.jsonl)step:\d+ - ")
# a piece cut before its `step:N - ` was whole: `s`, `st`, ..., `step:16 -`
_STEP_START = re.compile(r"^s(?:t(?:e(?:p(?::(?:\d+(?: (?:- ?)?)?)?)?)?)?)?$")
# a held line takes at most this many pieces after it (a cut in two is what Ray does; more is a safety margin)
MAX_PIECES = 8


def _ended(text: str) -> bool:
    return text.endswith(LINE_END)


class StepLines:
    """Feed each output line; get back the lines to hand on, step lines whole where their pieces came.

    `marked=False` (a verl without the patch): every line is handed on at once, as it came.
    """

    def __init__(self, *, marked: bool = True) -> None:
        self.marked = marked
        # actor prefix -> (its prefix as printed, the held line's text after it, pieces appended)
        self._held: dict[str, tuple[str, str, int]] = {}

    def feed(self, line: str) -> list[str]:
        """The lines that are ready after `line` (without their newline): none (a step line held), `line`, or a
        held line and `line`."""
        text = line.rstrip("\r\n")
        if not self.marked:
            return [text]
        match = _PREFIX.match(text)
        printed, body = (match.group(1), text[match.end() :]) if match else ("", text)
        actor = printed.strip()
        ready: list[str] = []
        held = self._held.pop(actor, None)
        if held is not None:
            held_printed, joined, pieces = held
            if _STEP.search(body) or not (_STEP.search(joined) or _STEP.search(joined + body)):
                if not _STEP_START.match(joined + body):
                    # a new step line began, or the held start was not one: the held line is handed on as it is
                    ready.append(held_printed + joined)
                    held = None
            if held is not None:
                joined += body
                if _ended(joined) or pieces + 1 >= MAX_PIECES:
                    return [held_printed + joined]
                self._held[actor] = (held_printed, joined, pieces + 1)
                return []
        if (_STEP.search(body) and not _ended(body)) or _STEP_START.match(body):
            self._held[actor] = (printed, body, 0)
            return ready
        return [*ready, text]

    def flush(self) -> list[str]:
        """What is still held when the output ends, as it is."""
        held = [printed + joined for printed, joined, _ in self._held.values()]
        self._held.clear()
        return held


__all__ = ["LINE_END", "LINE_END_KEY", "MAX_PIECES", "StepLines"]
