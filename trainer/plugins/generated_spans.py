"""The loss-mask invariant, checked directly: mask 1 exactly on the tokens the rollout server generated.

trainer/plugins/masks.py finds `<tool_response>` blocks in the text, which misses an observation a chat template renders
without the tag, or one spliced into an assistant turn (the heuristic exempts the model's own turns). The agent
loop knows better: it records, per trajectory, the response-relative token ranges [start, end) that came back
from the server's `generate()` (trainer/plugins/agent_loop.py), after verl's merge and clipped where verl truncates the
response. The update must train on exactly those tokens: everything else in the response (a scripted turn, chat
template tokens, tool responses) is environment. The sampler (trainer/plugins/sampler.py) logs per step:

    loss/mask_outside_generated      mask-1 tokens outside every generated span: environment text trained on
    loss/mask_missing_in_generated   mask-0 tokens inside a generated span: sampled tokens the update skips
    loss/unrecorded_trajectories     trajectories without a record (another agent loop ran them), unchecked

All three must be 0 (trainer/step_checks.py): the first is the bug class (observations or scripted text in the
loss), the second means the policy's own samples were dropped from the loss (its gradient goes missing without a
trace), and the third means the check did not run for some trajectories, which is a failure, never a pass.

The record is a string, "0:40,130:192" (empty: nothing generated), because verl stacks every extra field into a
numpy object array, where lists of equal length would broadcast into a 2-D array (trainer/plugins/reward.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

# trajectory extra_fields keys written by trainer/plugins/agent_loop.py
SPANS = "searchrl_generated_spans"
LAST_TURN = "searchrl_last_generated_turn"  # the decoded text of the last span (the model's own last turn)
TOOL_RESPONSES = "searchrl_tool_responses"  # environment messages merged into the response

OUTSIDE = "loss/mask_outside_generated"
MISSING = "loss/mask_missing_in_generated"
UNRECORDED = "loss/unrecorded_trajectories"

Span = tuple[int, int]


def format_spans(spans: Iterable[Span]) -> str:
    """ "0:40,130:192" for [(0, 40), (130, 192)]; empty spans are left out."""
    return ",".join(f"{start}:{end}" for start, end in spans if end > start)


def parse_spans(text: str) -> list[Span]:
    """The inverse of format_spans; a malformed record raises ValueError (a bug, not data to skip)."""
    spans = []
    for part in filter(None, text.split(",")):
        start, sep, end = part.partition(":")
        if not sep or int(start) < 0 or int(end) < int(start):
            raise ValueError(f"malformed generated-span record {text!r}")
        spans.append((int(start), int(end)))
    return spans


def clip_spans(spans: Iterable[Span], length: int) -> list[Span]:
    """The spans cut at `length` (verl keeps only the first response_length tokens), empty ones dropped."""
    return [(start, min(end, length)) for start, end in spans if min(end, length) > start]


def mask_span_counts(mask: Sequence[int] | np.ndarray, spans: Sequence[Span]) -> tuple[int, int]:
    """(mask-1 tokens outside every span, mask-0 tokens inside a span) of one trajectory; a span past the mask's
    end counts the tokens past it as mask 0, and overlapping spans count a shared mask-0 token once each."""
    ones = np.asarray(mask) != 0
    covered = np.zeros(len(ones), dtype=bool)
    missing = 0
    for start, end in spans:
        covered[start:end] = True
        missing += (end - start) - int(np.count_nonzero(ones[start:end]))  # past the mask's end: missing
    return int(np.count_nonzero(ones & ~covered)), missing


def record_of(extra_fields: object) -> list[Span] | None:
    """A trajectory's recorded spans, or None where the agent loop wrote no record."""
    value = extra_fields.get(SPANS) if isinstance(extra_fields, Mapping) else None
    return parse_spans(value) if isinstance(value, str) else None


def _in_order(spans: Sequence[Span]) -> bool:
    """Each span starts at or after the previous one's end (what the agent loop records)."""
    return all(start >= prev_end for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False))


def mask_prefix(mask: np.ndarray) -> np.ndarray:
    """The step's loss masks laid end to end as prefix counts: [i] is the number of mask-1 (non-zero) tokens
    before position i, so any range's count is two lookups."""
    mask = np.asarray(mask)
    ones = np.zeros(len(mask) + 1, dtype=np.int64)
    if mask.size and mask.dtype.kind in "biu" and mask.min() >= 0 and mask.max() <= 1:
        np.cumsum(mask, out=ones[1:])  # 0/1 already (verl's masks): summed as they are, twice as fast
    else:
        np.cumsum(mask != 0, out=ones[1:])
    return ones


def flat_span_metrics(
    ones: np.ndarray, lengths: Sequence[int], records: Sequence[list[Span] | None]
) -> dict[str, float]:
    """The invariant's metrics of a step laid end to end: trajectory r is the next `lengths[r]` tokens,
    `records[r]` its recorded spans (`record_of`; None: unrecorded), `ones` the loss masks as prefix counts
    (`mask_prefix`): each span's mask-1 tokens are two lookups, the whole step a few numpy operations."""
    outside = missing = unrecorded = 0
    los: list[int] = []  # where each span of the trajectories counted together starts and ends in the step
    his: list[int] = []
    widths = offset = 0
    for spans, length in zip(records, lengths, strict=True):
        start_at, offset = offset, offset + length
        if spans is None:
            unrecorded += 1
            continue
        if not _in_order(spans):  # overlapping spans: this trajectory alone, each span counted on its own
            a, b = mask_span_counts(np.diff(ones[start_at : offset + 1]), spans)
            outside, missing = outside + a, missing + b
            continue
        outside += int(ones[offset] - ones[start_at])  # less those inside its spans, below
        for start, end in spans:
            los.append(start_at + min(start, length))
            his.append(start_at + min(end, length))
            widths += end - start
    if los:
        in_spans = int((ones[np.array(his)] - ones[np.array(los)]).sum())
        missing += widths - in_spans  # mask 0 or past the mask's end, inside a span
        outside -= in_spans  # spans in order do not overlap: every other mask-1 token is outside them
    return {OUTSIDE: float(outside), MISSING: float(missing), UNRECORDED: float(unrecorded)}


def span_step_metrics(rows: Iterable[tuple[object, Sequence[int] | np.ndarray]]) -> dict[str, float]:
    """The invariant's metrics of one step from its trajectories' (extra_fields, loss mask) pairs (lists or numpy
    arrays), through `flat_span_metrics`."""
    records, masks = [], []
    for extra_fields, mask in rows:
        records.append(record_of(extra_fields))
        masks.append(np.asarray(mask))
    flat = np.concatenate(masks) if masks else np.zeros(0, dtype=np.int64)
    return flat_span_metrics(mask_prefix(flat), [len(m) for m in masks], records)


__all__ = [
    "LAST_TURN",
    "MISSING",
    "OUTSIDE",
    "SPANS",
    "TOOL_RESPONSES",
    "UNRECORDED",
    "clip_spans",
    "flat_span_metrics",
    "format_spans",
    "mask_prefix",
    "mask_span_counts",
    "parse_spans",
    "record_of",
    "span_step_metrics",
]
