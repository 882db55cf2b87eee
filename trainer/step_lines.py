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

from searchrl.trainer.step_checks import STEP_LINE

LINE_END_KEY = "searchrl/line_end"
LINE_END = f" - {LINE_END_KEY}:1"
# Ray's prefix on a forwarded line, `(Name pid=N[, ip=...]) `, with or without its ANSI colour
_PREFIX = re.compile(r"^((?:\x1b\[[0-9;]*m)?\([^()\n]*pid=\d+[^()\n]*\)(?:\x1b\[[0-9;]*m)? ?)")
# a step line is what step_checks' reader reads as one
_STEP = STEP_LINE
# a piece cut before its `step:N - ` was whole: `s`, `st`, ..., `step:16 -`
_STEP_START = re.compile(r"^s(?:t(?:e(?:p(?::(?:\d+(?: (?:- ?)?)?)?)?)?)?)?$")
# a held line takes at most this many pieces after it (a cut in two is what Ray does; more is a safety margin)
MAX_PIECES = 8


def _ended(text: str) -> bool:
    return text.endswith(LINE_END)


class StepLines:
    """Feed each output line; get back the lines to hand on, step lines whole where their pieces came.

    `marked=False`: every line is handed on at once, as it came. A run turns it off by itself when its first step
    line turns out to carry no end (a verl without the patch): that line is handed on when its actor's next line
    does not end it, `unmarked` becomes True, and from then on nothing is held. Until a step line has ended, a
    held line is joined only with a piece that ends it, so an unpatched verl's next line is never glued on.
    """

    def __init__(self, *, marked: bool = True) -> None:
        self.marked = marked
        self.unmarked = False  # the run's step lines turned out to carry no end
        self._seen_end = False  # a step line with the end arrived: the run is patched
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
            if _STEP.search(body):
                ready.append(held_printed + joined)  # a new step line began: the held one never ended
                if not self._seen_end and not _ended(body):
                    self.marked, self.unmarked = False, True  # no step line of this run has an end
                    return [*ready, text]
            else:
                candidate = joined + body
                if _ended(candidate):
                    self._seen_end = True
                    return [held_printed + candidate]
                if self._seen_end and (_STEP.search(candidate) or _STEP_START.match(candidate)):
                    if pieces + 1 >= MAX_PIECES:
                        return [held_printed + candidate]
                    self._held[actor] = (held_printed, candidate, pieces + 1)
                    return []
                ready.append(held_printed + joined)  # handed on as it is: no end came
                if not self._seen_end:
                    self.marked, self.unmarked = False, True
                    return [*ready, text]
        if (_STEP.search(body) and not _ended(body)) or _STEP_START.match(body):
            self._held[actor] = (printed, body, 0)
            return ready
        if _STEP.search(body):
            self._seen_end = True
        return [*ready, text]

    def flush(self) -> list[str]:
        """What is still held when the output ends, as it is."""
        held = [printed + joined for printed, joined, _ in self._held.values()]
        self._held.clear()
        return held


__all__ = ["LINE_END", "LINE_END_KEY", "MAX_PIECES", "StepLines"]
