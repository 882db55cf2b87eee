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
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from typing import Any

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


def _counts(spans: Sequence[tuple[int, int, bool]], mask: Sequence[int]) -> tuple[int, int, int]:
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
    return {
        f"{PREFIX}observation_tokens": float(inside),
        f"{PREFIX}observation_tokens_in_loss": float(in_loss),
        MODEL_TOOL_RESPONSE_TOKENS: float(model_written),
        f"{PREFIX}trained_tokens": float(trained),
    }


__all__ = [
    "CLOSE",
    "MODEL_TOOL_RESPONSE_TOKENS",
    "OPEN",
    "TURN",
    "mask_step_metrics",
    "observation_counts",
    "observation_spans",
    "tool_response_spans",
]
