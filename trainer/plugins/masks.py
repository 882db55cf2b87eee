"""Which trained tokens sit inside tool responses: the loss mask measured on every training batch.

A search agent must never be trained to predict the passages the retrieval service returned: those tokens are
observations, and verl marks them with loss mask 0 (DESIGN.md 3b). Nothing in verl's metrics shows whether that
held, so a tool-response template change, a tokenizer whose markers merge with neighbouring text, or an agent
loop that appends observations as assistant tokens trains on retrieved text and prints the same table.

This module finds the spans from the text itself, not from the agent loop's bookkeeping: it joins the tokens'
own strings (`tokenizer.convert_ids_to_tokens`, in which ASCII markers survive byte-level and sentencepiece
encodings alike), finds every `<tool_response>` ... `</tool_response>` (to the end when a response was cut off),
and counts the tokens that overlap a span and carry loss mask 1. trainer/plugins/sampler.py logs the counts per step:

    loss/observation_tokens           tokens inside tool responses in the step
    loss/observation_tokens_in_loss   those with loss mask 1 (must be 0: the CPU runs check every step)
    loss/model_tool_response_tokens   tokens inside `<tool_response>` text the model wrote itself
    loss/trained_tokens               all tokens with loss mask 1

A real model writes the markers too: SmolLM2-135M, shown the repo's template, answers with `<tool_response>\n...`
made up in its own turn in about half its samples (issue 32's real-weights run counted 73 such tokens in one
step). That text is the policy's own sample, rightly trained on, not an observation. So with ChatML turn markers
in the response, a span counts as an observation only inside a turn the model did not write (the role after the
last `<|im_start|>` before it is not `assistant`; the response opens in the assistant's turn); the model's own
spans are counted apart. Without any turn marker the role cannot be told from the text: a span inside a range the
agent loop recorded as server-generated (trainer/plugins/generated_spans.py, when the caller passes them) is the model's
own, and every other span counts as an observation (the strict reading: a false alarm rather than a missed one).
That case is `make learn-cpu-real --stage query`, whose response opens inside the assistant's turn (the header is
in the prompt) and holds no turn marker at all.

**Every step, from the ids** (issue 53). The sampler runs on verl's driver while the GPUs wait, and a GPU step is
2,560 trajectories of up to 1,500 tokens: `convert_ids_to_tokens` alone, a Python call per token, cost seconds.
`flat_mask_metrics` (the sampler's; `step_metrics_from_ids` takes rows) reads the same strings from a table built
once (`TokenStrings`: that function's own output for every id), drops the tokens no marker can reach (a marker
starts at a `<` and spans at most 16 characters, so at most 16 tokens; a role after `<|im_start|>` runs on through
whitespace and letters, and a trajectory whose role might run past a dropped token is read whole), and searches
what is left of the step's text at once. That text differs from the joined strings only where no match can be,
so it holds the same blocks and the same roles, and the four numbers are the same on every trajectory
(tests/trainer/plugins/test_mask_ids.py compares them with `mask_step_metrics` on varied inputs; `make bench-step-checks`
on a whole step, with the time). Tokens whose ids the table lacks, or a vocabulary with an empty token string,
take the string path, as before.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from searchrl.trainer.plugins.generated_spans import mask_prefix

OPEN = "<tool_response>"
CLOSE = "</tool_response>"
PREFIX = "loss/"
MODEL_TOOL_RESPONSE_TOKENS = f"{PREFIX}model_tool_response_tokens"  # the model's own <tool_response> text


TURN = "<|im_start|>"
_ROLE = re.compile(r"<\|im_start\|>[\sĊĠ]*([A-Za-z]+)")


def tool_response_spans(
    pieces: Sequence[str], generated: Sequence[tuple[int, int]] | None = None
) -> list[tuple[int, int, bool]]:
    """(start, end, written by the environment) token index ranges that overlap a `<tool_response>` block;
    `generated`: the server-generated token ranges, which decide a span's author where no turn marker does."""
    starts = []
    position = 0
    for piece in pieces:
        starts.append(position)
        position += len(piece)
    text = "".join(pieces)
    roles = [(m.start(), m.group(1).lower()) for m in _ROLE.finditer(text)]
    spans = []
    at = text.find(OPEN)
    while at != -1:
        close = text.find(CLOSE, at + len(OPEN))
        end_char = len(text) if close == -1 else close + len(CLOSE)
        first = bisect.bisect_right(starts, at) - 1
        last = bisect.bisect_left(starts, end_char)  # first token starting at or after the span's end
        before = [role for start, role in roles if start < at]
        if roles:
            environment = (before[-1] if before else "assistant") != "assistant"
        else:
            environment = not any(lo <= first and last <= hi for lo, hi in generated or ())
        spans.append((first, last, environment))
        at = text.find(OPEN, end_char)
    return spans


def observation_spans(pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Token index ranges [start, end) of the tool responses the environment wrote (markers included)."""
    return [(start, end) for start, end, environment in tool_response_spans(pieces) if environment]


def _counts(spans: Sequence[tuple[int, int, bool]], mask: Sequence[int] | np.ndarray) -> tuple[int, int, int]:
    """(observation tokens, those with loss mask 1, tokens of the model's own tool-response text)."""
    inside = in_loss = model_written = 0
    for start, end, environment in spans:
        if not environment:
            model_written += end - start
            continue
        window = mask[start:end]
        inside += len(window)
        in_loss += sum(1 for m in window if m)
    return inside, in_loss, model_written


def observation_counts(pieces: Sequence[str], mask: Sequence[int]) -> tuple[int, int]:
    """(tokens inside tool responses, those of them with loss mask 1) for one trajectory."""
    inside, in_loss, _ = _counts(tool_response_spans(pieces), mask)
    return inside, in_loss


def mask_step_metrics(rows: Iterable[tuple[Any, ...]]) -> dict[str, float]:
    """The `loss/*` metrics of one step from its trajectories' (token strings, loss mask[, server-generated
    ranges or None]) tuples."""
    inside = in_loss = trained = model_written = 0
    for pieces, mask, *rest in rows:
        generated = rest[0] if rest else None
        a, b, c = _counts(tool_response_spans(pieces, generated), mask)  # one span search a trajectory
        inside += a
        in_loss += b
        model_written += c
        trained += sum(1 for m in mask if m)
    return _metrics(inside, in_loss, model_written, trained)


def _metrics(inside: int, in_loss: int, model_written: int, trained: int) -> dict[str, float]:
    return {
        f"{PREFIX}observation_tokens": float(inside),
        f"{PREFIX}observation_tokens_in_loss": float(in_loss),
        MODEL_TOOL_RESPONSE_TOKENS: float(model_written),
        f"{PREFIX}trained_tokens": float(trained),
    }


# ---- the same metrics from token ids (issue 53) ---------------------------------------------------------------

REACH = 16  # tokens a marker can span from the token holding its `<`: each token is one character or more
GAP = "\x00"  # stands for a run of dropped tokens: in no marker, not whitespace, not a letter
END = "\x01"  # ends each trajectory's text, so that no match runs from one trajectory into the next
# a role that runs up to a gap might run on past it in the whole text: that trajectory is read whole
_ROLE_AT_GAP = re.compile(r"<\|im_start\|>[\sĊĠ]*[A-Za-z]*" + GAP)


class TokenStrings:
    """Every token string of a tokenizer, read once with its `convert_ids_to_tokens`, as numpy tables.

    Indexed with a step's ids, the table gives the strings `convert_ids_to_tokens` gives (it is that function's
    output, id by id) without a Python call per token. An id outside it (negative, past `len(tokenizer)`, or one
    the tokenizer has no string for) sends its trajectory back to the tokenizer and the string path, as before.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.size = len(pieces)
        self.gap, self.end = self.size, self.size + 1  # the two ids past the vocabulary: GAP and END
        known = [isinstance(p, str) for p in pieces]
        self.strings = np.empty(self.size + 2, dtype=object)  # filled, not built: one str a cell
        self.strings[:] = [*(p if k else "" for p, k in zip(pieces, known, strict=True)), GAP, END]
        self.lengths = np.array([len(t) for t in self.strings], dtype=np.int64)
        self.opens_marker = np.array(["<" in t for t in self.strings], dtype=bool)  # a marker can start in it
        self._known = np.array(known, dtype=bool)
        self._holes = not all(known)
        # An empty string in the vocabulary breaks REACH and lets one character offset name two tokens: then
        # every trajectory takes the string path (the same numbers, at the old speed).
        self.reads_ids = bool(self.lengths[: self.size].min(initial=1) > 0)

    def covers(self, ids: np.ndarray) -> bool:
        """Every id of `ids` has its string in the table."""
        if ids.size == 0:
            return True
        if int(ids.min()) < 0 or int(ids.max()) >= self.size:
            return False
        return not self._holes or bool(self._known[ids].all())

    def pieces(self, ids: np.ndarray) -> list[str]:
        """The tokens' strings, as `convert_ids_to_tokens` gives them."""
        if self.covers(ids):
            return list(self.strings[ids.astype(np.intp, copy=False)].tolist())
        return list(self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]))


def _occurrences(text: str, marker: str) -> list[int]:
    """Where `marker` starts in `text` (none of the three markers can overlap itself)."""
    found, at = [], text.find(marker)
    while at != -1:
        found.append(at)
        at = text.find(marker, at + len(marker))
    return found


def _step_text(
    ids: np.ndarray, starts: np.ndarray, strings: TokenStrings
) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """The text searched for a step laid end to end (`starts`: where each trajectory begins in `ids`, then the
    total): (text, where each of its items starts and where it ends, each item's token index in `ids` (a GAP's:
    its first dropped token; END's: -1), where each trajectory's END is).

    A token no marker can reach is dropped: a marker starts with `<` and is at most 16 characters long, so only
    the REACH tokens from one whose string holds a `<` can hold its characters. Each run of dropped tokens
    becomes one GAP and each trajectory ends with END; neither can be part of a match, so every match here is a
    match in that trajectory's joined strings and every match there is one here, in the same order. The one
    exception, a role's whitespace and letters running into a GAP, is what `_ROLE_AT_GAP` catches."""
    n = len(ids)
    keep = np.zeros(n + REACH + 1, dtype=bool)
    after = np.flatnonzero(strings.opens_marker[ids])
    for k in range(REACH + 1):
        keep[after + k] = True
    keep = keep[:n]
    item = np.ones(n, dtype=bool)  # a kept token, or the first of a run of dropped ones (its GAP)
    item[1:] = keep[:-1]
    item[starts[:-1][np.diff(starts) > 0]] = True
    item |= keep
    origin = np.flatnonzero(item)
    stream = ids[origin]
    stream[~keep[origin]] = strings.gap
    cuts = np.searchsorted(origin, starts[1:])  # where each trajectory's END goes
    stream = np.insert(stream, cuts, strings.end)
    origin = np.insert(origin, cuts, -1)
    chars = np.zeros(len(stream) + 1, dtype=np.int64)
    np.cumsum(strings.lengths[stream], out=chars[1:])
    ends = chars[cuts + np.arange(len(cuts))]
    return "".join(strings.strings[stream].tolist()), chars, origin, ends


ENVIRONMENT, MODEL, UNDECIDED = 1, 0, -1  # who wrote a block; UNDECIDED: no turn marker, the record decides


def _id_blocks(
    ids: np.ndarray, starts: np.ndarray, strings: TokenStrings
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, set[int]]:
    """Every `<tool_response>` block of a step laid end to end, as `tool_response_spans` finds them: arrays of
    its trajectory, first token and end token (counted from the trajectory's start) and author (ENVIRONMENT,
    MODEL or UNDECIDED); and the trajectories whose role may run past a dropped token, whose blocks are left out
    (the caller reads them whole)."""
    text, chars, origin, ends = _step_text(ids, starts, strings)
    unsure = set(np.searchsorted(ends, [m.start() for m in _ROLE_AT_GAP.finditer(text)], "right").tolist())
    role_at: list[int] = []
    role_env: list[bool] = []
    for m in _ROLE.finditer(text):
        role_at.append(m.start())
        role_env.append(m.group(1).lower() != "assistant")
    opens = np.array(_occurrences(text, OPEN), dtype=np.int64)
    closes = np.array(_occurrences(text, CLOSE), dtype=np.int64)
    rows = np.searchsorted(ends, opens, "right")
    # each OPEN's block ends at the first CLOSE after it (a CLOSE cannot start inside an OPEN) in its trajectory,
    # or runs to the trajectory's end: cut off
    c = np.searchsorted(closes, opens)
    closed = c < len(closes)
    closed[closed] = np.searchsorted(ends, closes[c[closed]], "right") == rows[closed]
    until = ends[rows]
    until[closed] = closes[c[closed]] + len(CLOSE)
    # an OPEN inside the block before it (a second `<tool_response>` before the CLOSE) starts no block of its own
    inner = np.zeros(len(opens), dtype=bool)
    inner[1:] = (rows[1:] == rows[:-1]) & (opens[1:] < until[:-1])
    if inner.any():  # then whether an OPEN is inside depends on which blocks came before it: one at a time
        kept, reach, row_before = [], -1, -1
        for j, (at, row) in enumerate(zip(opens.tolist(), rows.tolist(), strict=True)):
            if row == row_before and at < reach:
                continue
            kept.append(j)
            reach, row_before = int(until[j]), row
        pick = np.array(kept, dtype=np.int64)
        opens, rows, closed, until = opens[pick], rows[pick], closed[pick], until[pick]
    # the token holding each block's `<`, and one past the token holding its CLOSE's `>`
    firsts = origin[np.searchsorted(chars, opens, "right") - 1]
    lasts = origin[np.searchsorted(chars, until - 1, "right") - 1] + 1
    lasts = np.where(closed, lasts, starts[rows + 1]) - starts[rows]
    firsts = firsts - starts[rows]
    # the author: the role of the last `<|im_start|>` before the block in its trajectory; none before it in a
    # trajectory with turn markers is the assistant's (the response opens in its turn); none at all: UNDECIDED
    role_at_a = np.array(role_at, dtype=np.int64)
    role_rows = np.searchsorted(ends, role_at_a, "right")
    k = np.searchsorted(role_at_a, opens) - 1
    known = (k >= 0) & (role_rows[np.maximum(k, 0)] == rows) if len(role_at) else np.zeros(len(opens), bool)
    authors = np.where(np.isin(rows, role_rows), MODEL, UNDECIDED)
    if len(role_at):
        authors = np.where(known, np.array(role_env, dtype=np.int64)[np.maximum(k, 0)], authors)
    sure = ~np.isin(rows, list(unsure))
    return rows[sure], firsts[sure], lasts[sure], authors[sure], unsure


def flat_mask_metrics(
    ids: np.ndarray,
    ones: np.ndarray,
    lengths: np.ndarray,
    generated: Sequence[Sequence[tuple[int, int]] | None],
    strings: TokenStrings,
) -> dict[str, float]:
    """`mask_step_metrics` of a step laid end to end: trajectory r is the next `lengths[r]` ids, `generated[r]`
    its server-generated ranges (or None), and `ones` the step's loss masks as prefix counts (`mask_prefix`).
    Same text, same search, same four numbers on every trajectory, without a Python call per token (module
    docstring)."""
    given = ids = np.asarray(ids).astype(np.intp, copy=False)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    bounds = starts.tolist()
    inside = in_loss = model_written = 0
    slow: set[int] = set()
    if not strings.reads_ids:
        slow = set(range(len(lengths)))
    elif not strings.covers(ids):  # ids the table lacks: those trajectories go to the tokenizer, as before
        slow = {r for r in range(len(lengths)) if not strings.covers(ids[bounds[r] : bounds[r + 1]])}
        ids = ids.copy()
        for r in slow:
            ids[bounds[r] : bounds[r + 1]] = strings.gap
    if len(slow) < len(lengths):
        rows, firsts, lasts, authors, unsure = _id_blocks(ids, starts, strings)
        if slow:
            own = ~np.isin(rows, list(slow))
            rows, firsts, lasts, authors = rows[own], firsts[own], lasts[own], authors[own]
        slow |= unsure
        for j in np.flatnonzero(authors == UNDECIDED).tolist():  # no turn marker: the record decides
            first, last = int(firsts[j]), int(lasts[j])
            spans = generated[int(rows[j])] or ()
            authors[j] = MODEL if any(lo <= first and last <= hi for lo, hi in spans) else ENVIRONMENT
        model_written += int((lasts - firsts)[authors == MODEL].sum())
        env = authors == ENVIRONMENT
        base, size = starts[rows[env]], lengths[rows[env]]
        lo = base + np.minimum(firsts[env], size)  # the mask's part of the block: it may end before the ids
        hi = base + np.minimum(lasts[env], size)
        inside += int((hi - lo).sum())
        in_loss += int((ones[hi] - ones[lo]).sum())
    for r in sorted(slow):  # the string path, one trajectory at a time
        window = slice(bounds[r], bounds[r + 1])
        mask = np.diff(ones[bounds[r] : bounds[r + 1] + 1])
        a, b, c = _counts(tool_response_spans(strings.pieces(given[window]), generated[r]), mask)
        inside, in_loss, model_written = inside + a, in_loss + b, model_written + c
    return _metrics(inside, in_loss, model_written, int(ones[-1]))


def step_metrics_from_ids(rows: Sequence[tuple[Any, ...]], strings: TokenStrings) -> dict[str, float]:
    """`mask_step_metrics` of the same trajectories from their token ids: (token ids, loss mask[, server-generated
    ranges or None]) tuples, ids and masks as numpy arrays or lists (`flat_mask_metrics` laid end to end)."""
    ready = [(np.asarray(ids), np.asarray(mask), rest[0] if rest else None) for ids, mask, *rest in rows]
    even = [row for row in ready if len(row[0]) == len(row[1])]
    inside = in_loss = model_written = trained = 0
    for ids, mask, generated in ready:  # a mask longer or shorter than its ids: the string path
        if len(ids) != len(mask):
            a, b, c = _counts(tool_response_spans(strings.pieces(ids), generated), mask)
            inside, in_loss, model_written = inside + a, in_loss + b, model_written + c
            trained += int(np.count_nonzero(mask))
    if even:
        lengths = np.array([len(ids) for ids, _, _ in even], dtype=np.int64)
        flat = flat_mask_metrics(
            np.concatenate([ids for ids, _, _ in even]),
            mask_prefix(np.concatenate([mask for _, mask, _ in even])),
            lengths,
            [generated for _, _, generated in even],
            strings,
        )
        inside += int(flat[f"{PREFIX}observation_tokens"])
        in_loss += int(flat[f"{PREFIX}observation_tokens_in_loss"])
        model_written += int(flat[MODEL_TOOL_RESPONSE_TOKENS])
        trained += int(flat[f"{PREFIX}trained_tokens"])
    return _metrics(inside, in_loss, model_written, trained)


__all__ = [
    "CLOSE",
    "MODEL_TOOL_RESPONSE_TOKENS",
    "OPEN",
    "TURN",
    "TokenStrings",
    "flat_mask_metrics",
    "mask_step_metrics",
    "observation_counts",
    "observation_spans",
    "step_metrics_from_ids",
    "tool_response_spans",
]
