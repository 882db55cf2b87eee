"""Which trained tokens sit inside tool responses: the loss mask measured on every training batch.

A search agent must never be trained to predict the passages the retrieval service returned: those tokens are
observations, and verl marks them with loss mask 0 (DESIGN.md 3b). Nothing in verl's metrics shows whether that
held, so a tool-response template change, a tokenizer whose markers merge with neighbouring text, or an agent
loop that appends observations as assistant tokens trains on retrieved text and prints the same table.

This module finds the spans from the text itself, not from the agent loop's bookkeeping: it joins the tokens'
own strings (`tokenizer.convert_ids_to_tokens`, in which ASCII markers survive byte-level and sentencepiece
encodings alike), finds every `<tool_response>` ... `</tool_response>` (to the end when a response was cut off),
and counts the tokens that overlap a span and carry loss mask 1. trainer/sampler.py logs the counts per step:

    loss/observation_tokens           tokens inside tool responses in the step
    loss/observation_tokens_in_loss   those with loss mask 1 (must be 0: the CPU runs check every step)
    loss/trained_tokens               all tokens with loss mask 1
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

OPEN = "<tool_response>"
CLOSE = "</tool_response>"
PREFIX = "loss/"


def observation_spans(pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Token index ranges [start, end) that overlap a tool response (markers included)."""
    starts = []
    text_parts = []
    position = 0
    for piece in pieces:
        starts.append(position)
        text_parts.append(piece)
        position += len(piece)
    text = "".join(text_parts)
    spans = []
    at = text.find(OPEN)
    while at != -1:
        close = text.find(CLOSE, at + len(OPEN))
        end_char = len(text) if close == -1 else close + len(CLOSE)
        first = bisect.bisect_right(starts, at) - 1
        last = bisect.bisect_left(starts, end_char)  # first token starting at or after the span's end
        spans.append((first, last))
        at = text.find(OPEN, end_char)
    return spans


def observation_counts(pieces: Sequence[str], mask: Sequence[int]) -> tuple[int, int]:
    """(tokens inside tool responses, those of them with loss mask 1) for one trajectory."""
    inside = in_loss = 0
    for start, end in observation_spans(pieces):
        window = mask[start:end]
        inside += len(window)
        in_loss += sum(1 for m in window if m)
    return inside, in_loss


def mask_step_metrics(rows: Iterable[tuple[Sequence[str], Sequence[int]]]) -> dict[str, float]:
    """The `loss/*` metrics of one step from its trajectories' (token strings, loss mask) pairs."""
    inside = in_loss = trained = 0
    for pieces, mask in rows:
        a, b = observation_counts(pieces, mask)
        inside += a
        in_loss += b
        trained += sum(1 for m in mask if m)
    return {
        f"{PREFIX}observation_tokens": float(inside),
        f"{PREFIX}observation_tokens_in_loss": float(in_loss),
        f"{PREFIX}trained_tokens": float(trained),
    }


__all__ = ["CLOSE", "OPEN", "mask_step_metrics", "observation_counts", "observation_spans"]
