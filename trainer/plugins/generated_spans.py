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


def mask_span_counts(mask: Sequence[int], spans: Sequence[Span]) -> tuple[int, int]:
    """(mask-1 tokens outside every span, mask-0 tokens inside a span) of one trajectory."""
    inside = [False] * len(mask)
    missing = 0
    for start, end in spans:
        window = mask[start:end]
        inside[start : start + len(window)] = [True] * len(window)
        missing += (end - start - len(window)) + sum(
            1 for m in window if not m
        )  # past the mask's end: missing
    outside = sum(1 for m, covered in zip(mask, inside, strict=True) if m and not covered)
    return outside, missing


def record_of(extra_fields: object) -> list[Span] | None:
    """A trajectory's recorded spans, or None where the agent loop wrote no record."""
    value = extra_fields.get(SPANS) if isinstance(extra_fields, Mapping) else None
    return parse_spans(value) if isinstance(value, str) else None


def span_step_metrics(rows: Iterable[tuple[object, Sequence[int]]]) -> dict[str, float]:
    """The invariant's metrics of one step from its trajectories' (extra_fields, loss mask) pairs."""
    outside = missing = unrecorded = 0
    for extra_fields, mask in rows:
        spans = record_of(extra_fields)
        if spans is None:
            unrecorded += 1
            continue
        a, b = mask_span_counts(mask, spans)
        outside += a
        missing += b
    return {OUTSIDE: float(outside), MISSING: float(missing), UNRECORDED: float(unrecorded)}


__all__ = [
    "LAST_TURN",
    "MISSING",
    "OUTSIDE",
    "SPANS",
    "TOOL_RESPONSES",
    "UNRECORDED",
    "clip_spans",
    "format_spans",
    "mask_span_counts",
    "parse_spans",
    "record_of",
    "span_step_metrics",
]
