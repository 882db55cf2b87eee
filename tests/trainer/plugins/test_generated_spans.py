"""The mask invariant from the agent loop's record (issue 39 item 3): mask 1 exactly on the generated tokens.

The agent loop's side (recording the spans through verl's real merges) is tests/trainer/plugins/test_agent_loop.py; here
the check itself, in milliseconds, including the case the `<tool_response>` heuristic (trainer/plugins/masks.py) exempts.
"""

from __future__ import annotations

import pytest

from searchrl.trainer.plugins.generated_spans import (
    MISSING,
    OUTSIDE,
    SPANS,
    UNRECORDED,
    clip_spans,
    format_spans,
    mask_span_counts,
    parse_spans,
    record_of,
    span_step_metrics,
)
from searchrl.trainer.plugins.masks import mask_step_metrics


def test_the_record_round_trips_as_a_string_and_is_cut_where_verl_truncates():
    spans = [(0, 40), (130, 192)]
    assert format_spans(spans) == "0:40,130:192" and parse_spans("0:40,130:192") == spans
    assert format_spans([(3, 3)]) == "" and parse_spans("") == []  # nothing generated is a record too
    assert clip_spans(spans, 150) == [(0, 40), (130, 150)] and clip_spans(spans, 100) == [(0, 40)]
    for bad in ("5", "7:3", "a:b", "-1:4"):
        with pytest.raises(ValueError):
            parse_spans(bad)
    assert record_of({SPANS: "1:2"}) == [(1, 2)] and record_of({}) is None and record_of(None) is None


def test_each_direction_of_a_broken_mask_is_counted():
    spans = [(0, 3), (6, 8)]
    assert mask_span_counts([1, 1, 1, 0, 0, 0, 1, 1, 0, 0], spans) == (0, 0)
    assert mask_span_counts([1, 1, 1, 1, 1, 0, 1, 1, 0, 0], spans) == (2, 0)  # environment trained on
    assert mask_span_counts([1, 0, 1, 0, 0, 0, 1, 0, 0, 0], spans) == (0, 2)  # samples left out
    metrics = span_step_metrics(
        [({SPANS: "0:3,6:8"}, [1, 1, 1, 1, 0, 0, 1, 0]), ({SPANS: ""}, [0, 0]), ({"other": 1}, [1, 1])]
    )
    # the unrecorded trajectory is counted, not checked: its mask-1 tokens are not guessed at
    assert metrics == {OUTSIDE: 1.0, MISSING: 1.0, UNRECORDED: 1.0}


def test_an_observation_spliced_into_the_assistant_turn_is_caught_where_the_text_heuristic_exempts_it(
    offline_tokenizer,
):
    """A loop that appends a tool response inside the model's turn, as assistant tokens with mask 1: the
    `<tool_response>` heuristic reads it as the model's own made-up block (0 in the loss); the record knows the
    server never generated it."""
    tok = offline_tokenizer
    parts = [
        ('<tool_call>\n{"name": "search"}\n</tool_call><|im_end|>\n', 0, False),  # scripted turn
        (
            "<|im_start|>user\n<tool_response>\nDoc 1 (Title: X) passage\n</tool_response><|im_end|>\n",
            0,
            False,
        ),
        ("<|im_start|>assistant\n", 0, False),  # the template's turn header
        ("The passage says", 1, True),  # generated
        ("<tool_response>\nDoc 2 (Title: Y) spliced passage\n</tool_response>", 1, False),  # spliced, mask 1
        (" so X<|im_end|>", 1, True),  # generated
    ]
    pieces: list[str] = []
    mask: list[int] = []
    spans = []
    spliced = 0
    for text, bit, generated in parts:
        ids = tok.encode(text, add_special_tokens=False)
        if generated:
            spans.append((len(pieces), len(pieces) + len(ids)))
        elif bit:
            spliced = len(ids)
        pieces += tok.convert_ids_to_tokens(ids)
        mask += [bit] * len(ids)
    heuristic = mask_step_metrics([(pieces, mask)])
    assert heuristic["loss/observation_tokens_in_loss"] == 0  # exempted as the model's own text
    assert heuristic["loss/model_tool_response_tokens"] > 0
    invariant = span_step_metrics([({SPANS: format_spans(spans)}, mask)])
    assert invariant == {OUTSIDE: float(spliced), MISSING: 0.0, UNRECORDED: 0.0} and spliced > 10
