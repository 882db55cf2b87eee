"""The loss-mask checks read from token ids give the string path's numbers (issue 53).

The sampler's `<tool_response>` counts used to come from `convert_ids_to_tokens` on every trajectory, joined and
searched (trainer/plugins/masks.py `mask_step_metrics`, kept as the reference). Now they come from the ids
(`step_metrics_from_ids`, `flat_mask_metrics`): a table of the same strings, the tokens no marker can reach
dropped, one search of the step's text. Here both run on the same steps and must agree exactly: hand-made
trajectories through a real byte-level BPE (the offline Qwen2.5-style tokenizer), and a thousand random
trajectories over a vocabulary built to split the markers every way it can (markers in one token, in pieces, glued
to their neighbours; roles after long runs of whitespace or letters; cut-off, nested and stray blocks; responses
without turn markers, with and without a generated-span record). The span invariant (generated_spans.py, now
numpy) is compared with its code before issue 53, kept below as the oracle.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from searchrl.trainer.plugins import masks
from searchrl.trainer.plugins.generated_spans import (
    MISSING,
    OUTSIDE,
    SPANS,
    UNRECORDED,
    format_spans,
    mask_span_counts,
    record_of,
    span_step_metrics,
)
from searchrl.trainer.plugins.masks import (
    CLOSE,
    OPEN,
    REACH,
    TURN,
    TokenStrings,
    mask_step_metrics,
    step_metrics_from_ids,
)
from searchrl.trainer.plugins.sampler import loss_step_metrics, response_rows

# ---- the oracles: the code as it was before issue 53 -----------------------------------------------------------


def _old_mask_span_counts(mask: Sequence[int], spans: Sequence[tuple[int, int]]) -> tuple[int, int]:
    inside = [False] * len(mask)
    missing = 0
    for start, end in spans:
        window = mask[start:end]
        inside[start : start + len(window)] = [True] * len(window)
        missing += (end - start - len(window)) + sum(1 for m in window if not m)
    outside = sum(1 for m, covered in zip(mask, inside, strict=True) if m and not covered)
    return outside, missing


def _old_span_step_metrics(rows: Iterable[tuple[object, Sequence[int]]]) -> dict[str, float]:
    outside = missing = unrecorded = 0
    for extra_fields, mask in rows:
        spans = record_of(extra_fields)
        if spans is None:
            unrecorded += 1
            continue
        a, b = _old_mask_span_counts(list(mask), spans)
        outside += a
        missing += b
    return {OUTSIDE: float(outside), MISSING: float(missing), UNRECORDED: float(unrecorded)}


def _old_rows(value: Any) -> list[list[int]]:
    return [[int(x) for x in row.tolist()] for row in value.unbind(0)]


def _reference(tokenizer: Any, rows: Sequence[tuple[Any, ...]]) -> dict[str, float]:
    """What the sampler computed before: token strings from the tokenizer, then the string search."""
    return mask_step_metrics(
        [
            (tokenizer.convert_ids_to_tokens([int(i) for i in ids]), list(mask), *rest)
            for ids, mask, *rest in rows
        ]
    )


# ---- a vocabulary that splits the markers every way -------------------------------------------------------------


class VocabTokenizer:
    """`convert_ids_to_tokens` over a fixed list, as a tokenizer has it; an id past it gives `unknown` (a slow
    tokenizer's unk string), and `encode` splits a text into random vocabulary pieces (so the same text comes
    out tokenized differently each time, as neighbouring text changes a BPE's merges)."""

    def __init__(self, vocab: list[str], unknown: str | None = None) -> None:
        self.vocab = vocab
        self.unknown = unknown
        self.by_start: dict[str, list[int]] = {}
        for i, piece in enumerate(vocab):
            if piece:
                self.by_start.setdefault(piece[0], []).append(i)

    def __len__(self) -> int:
        return len(self.vocab)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self.vocab[i] if 0 <= i < len(self.vocab) else self.unknown for i in ids]

    def encode(self, text: str, rng: random.Random) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            fits = [i for i in self.by_start[text[at]] if text.startswith(self.vocab[i], at)]
            i = rng.choice(fits)
            ids.append(i)
            at += len(self.vocab[i])
        return ids


_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t<>|_/{}():,.\"'=!?-ĊĠé\u3000\x00\x01"
)
# pieces of the markers, markers glued to neighbours, roles split and joined to whitespace (space-separated here)
_PIECES = (
    "<|im_end|> <tool _response _response> response tool </ </tool <|im_st art|> <|im _start|> |> >< >Ċ e> x< << "
    "Ġ< Ċ< assistant Assistant ASSISTANT ass istant Ġassistant Ċassistant user Ġuser system Ċ ĊĊ Ġ ĠĠ Doc Title "
    'Ġthe Ġpassage <think> </think> <tool_call> </tool_call> {" "} query Ġ1 é<'
).split()
VOCAB = sorted(set(_CHARS) | {OPEN, CLOSE, TURN, "  ", "\n\n", ">\n", "\u3000<", *_PIECES})


def _text(rng: random.Random) -> str:
    """A response: turn markers with roles after varied whitespace, tool responses whole, cut, nested or stray,
    the model's own, passages, and runs long enough to pass REACH tokens."""
    parts = []
    for _ in range(rng.randint(0, 14)):
        kind = rng.random()
        if kind < 0.2:
            space = rng.choice(["\n", "", " ", "Ċ", "Ġ", "\u3000", "\t", " " * rng.randint(REACH, 3 * REACH)])
            role = rng.choice(
                ["assistant", "user", "tool", "system", "Assistant", "assistantx", "a" * 40, ""]
            )
            parts.append(TURN + space + role + rng.choice(["\n", "", ":", "<"]))
        elif kind < 0.45:
            body = rng.choice(
                ["Doc 1 (Title: X) the passage", "", "made up", " ".join("word" for _ in range(30))]
            )
            parts.append(
                OPEN + rng.choice(["\n", ""]) + body + rng.choice(["\n" + CLOSE, CLOSE, "", " " + OPEN])
            )
        elif kind < 0.55:
            parts.append(
                rng.choice([CLOSE, OPEN, "<|im_end|>", '<tool_call>\n{"query"}\n</tool_call>', "<", "|>"])
            )
        elif kind < 0.65:
            parts.append("\x00" if rng.random() < 0.5 else "\x01")
        else:
            length = rng.randint(1, 60)
            parts.append("".join(rng.choice(_CHARS[:-2]) for _ in range(length)))
    return "".join(parts)


def _spans(rng: random.Random, length: int) -> list[tuple[int, int]] | None:
    kind = rng.random()
    if kind < 0.15:
        return None  # unrecorded
    cuts = sorted(rng.sample(range(length + 3), min(length + 3, rng.randint(0, 6))))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a]
    if kind > 0.9 and spans:  # overlapping or out of order: counted span by span, as before
        spans.append((max(spans[0][0] - 1, 0), spans[0][1] + 2))
    return spans


def _random_rows(tok: VocabTokenizer, rng: random.Random, count: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for _ in range(count):
        ids = tok.encode(_text(rng), rng)
        mask = (
            [int(rng.random() < 0.5) for _ in ids] if rng.random() < 0.5 else [rng.choice([0, 1])] * len(ids)
        )
        rows.append((np.array(ids, dtype=np.int64), np.array(mask, dtype=np.int64), _spans(rng, len(ids))))
    return rows


def test_random_steps_count_the_same_by_ids_as_by_strings() -> None:
    rng = random.Random(53)
    tok = VocabTokenizer(VOCAB)
    strings = TokenStrings(tok)
    unsure = blocks = 0
    for _ in range(40):
        rows = _random_rows(tok, rng, 25)
        assert step_metrics_from_ids(rows, strings) == _reference(tok, rows)
        for row in rows:  # trajectory by trajectory too, so a difference names its trajectory
            assert step_metrics_from_ids([row], strings) == _reference(tok, [row]), row
        lengths = np.array([len(ids) for ids, _, _ in rows])
        found = masks._id_blocks(np.concatenate([r[0] for r in rows]), np.r_[0, np.cumsum(lengths)], strings)
        blocks += len(found[0])
        unsure += len(found[4])
    assert blocks > 500 and unsure > 5  # both the id search and the whole-trajectory fallback were exercised


def _realistic(tok: Any) -> list[tuple[list[int], list[int], list[tuple[int, int]] | None]]:
    """Trajectories the agent loop makes, each (ids, mask, generated spans), tokenized by a real BPE part by
    part as the loop tokenizes them."""
    call = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["Seventh Seal director"]}}\n</tool_call>'
    passages = (
        "Doc 1 (Title: The Seventh Seal) a 1957 film by Ingmar Bergman\nDoc 2 (Title: Bergman) director"
    )
    observation = f"\n<|im_start|>user\n<tool_response>\n{passages}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    cases = [
        [(call + "<|im_end|>", 1), (observation, 0), ("<answer>Ingmar Bergman</answer><|im_end|>", 1)],
        # the model's own made-up tool response inside its turn (SmolLM2 does this), then the real one
        [(call + "\n<tool_response>\nmade up\n</tool_response><|im_end|>", 1), (observation, 0)],
        # cut off inside the environment's tool response (verl truncates at response_length)
        [(call + "<|im_end|>", 1), (observation[:60], 0)],
        # no turn marker at all: the query stage's response, own text with a record
        [("bergman</tool_call>", 1), ("<tool_response>\nmade up\n</tool_response>", 1)],
        # a tool response glued to words and punctuation, and a stray close
        [("x<tool_response>y</tool_response>z</tool_response>", 1), (observation, 0)],
        # two opens before a close, and a role run far past REACH tokens
        [("<|im_start|>" + " " * 60 + "assistant\n<tool_response><tool_response>a</tool_response>", 1)],
        # the observation appended as assistant text (a bug the invariant catches): mask 1 outside the record
        [(call + "<|im_end|>", 1), (observation, 1)],
        [],
    ]
    rows = []
    for parts in cases:
        ids: list[int] = []
        mask: list[int] = []
        spans = []
        for text, bit in parts:
            piece = tok.encode(text, add_special_tokens=False)
            if bit and text is not observation:
                spans.append((len(ids), len(ids) + len(piece)))
            ids += piece
            mask += [bit] * len(piece)
        rows.append((ids, mask, spans))
    rows.append((rows[0][0], rows[0][1], None))  # the same without a record
    return rows


def test_a_real_tokenizers_trajectories_count_the_same(offline_tokenizer: Any) -> None:
    rows = _realistic(offline_tokenizer)
    strings = TokenStrings(offline_tokenizer)
    got = step_metrics_from_ids(rows, strings)
    assert got == _reference(offline_tokenizer, rows)
    assert got["loss/observation_tokens"] > 0 and got["loss/model_tool_response_tokens"] > 0
    assert got["loss/observation_tokens_in_loss"] > 0  # the appended observation
    for row in rows:
        assert step_metrics_from_ids([row], strings) == _reference(offline_tokenizer, [row])


def test_the_sampler_step_counts_as_before_from_verls_tensors(offline_tokenizer: Any) -> None:
    """What `sample()` runs, from TransferQueue's fields (jagged nested, or padded, with a padding row), against
    the code before issue 53: int lists, the span check, convert_ids_to_tokens and the string search."""
    rows = [r for r in _realistic(offline_tokenizer) if r[0]]
    extras: list[Mapping[str, Any]] = [{SPANS: format_spans(g)} if g is not None else {} for *_, g in rows]
    width = max(len(ids) for ids, _, _ in rows)
    jagged = [
        torch.nested.nested_tensor([torch.tensor(r[k]) for r in rows], layout=torch.jagged) for k in (0, 1)
    ]
    padded = [torch.tensor([r[k] + [0] * (width - len(r[k])) for r in rows]) for k in (0, 1)]
    strings = TokenStrings(offline_tokenizer)
    for responses, response_mask in (jagged, padded):
        padding = [False] * len(rows)
        old = list(zip(_old_rows(responses), _old_rows(response_mask), strict=True))
        new = response_rows(responses, response_mask, padding)
        assert [(a.tolist(), b.tolist()) for a, b in new] == old
        expected = _old_span_step_metrics(zip(extras, (m for _, m in old), strict=True))
        expected.update(
            mask_step_metrics(
                [
                    (offline_tokenizer.convert_ids_to_tokens(i), m, record_of(e))
                    for (i, m), e in zip(old, extras, strict=True)
                ]
            )
        )
        assert loss_step_metrics(extras, new, strings) == expected
        assert loss_step_metrics(extras, new, None) == {
            k: expected[k] for k in (OUTSIDE, MISSING, UNRECORDED)
        }
    # a padding row (verl's filler) is left out of both
    with_pad = response_rows(jagged[0], jagged[1], [False] * (len(rows) - 1) + [True])
    assert len(with_pad) == len(rows) - 1


def test_ids_the_table_lacks_and_empty_strings_take_the_string_path() -> None:
    rng = random.Random(7)
    tok = VocabTokenizer(VOCAB, unknown="<unk>")
    rows = _random_rows(tok, rng, 30)
    rows[3] = (np.r_[rows[3][0], len(VOCAB) + 5], np.r_[rows[3][1], 1], rows[3][2])  # past the vocabulary
    rows[4] = (np.r_[-1, rows[4][0]], np.r_[0, rows[4][1]], rows[4][2])  # negative
    assert step_metrics_from_ids(rows, TokenStrings(tok)) == _reference(tok, rows)
    holes = VocabTokenizer([*VOCAB, ""])  # an empty token string: no id search at all
    assert not TokenStrings(holes).reads_ids
    assert step_metrics_from_ids(rows[5:], TokenStrings(holes)) == _reference(holes, rows[5:])
    odd = [(rows[0][0], rows[0][1][:-2], None), rows[1]]  # a mask shorter than its ids
    assert step_metrics_from_ids(odd, TokenStrings(tok)) == _reference(tok, odd)


def test_the_text_searched_drops_what_no_marker_reaches(offline_tokenizer: Any) -> None:
    """The id search really searches less than the whole text, and a role that runs past what it kept sends
    its trajectory to the string path."""
    strings = TokenStrings(offline_tokenizer)
    rows = _realistic(offline_tokenizer)
    long_passages = " the passage goes on" * 40
    ids = offline_tokenizer.encode(f"<|im_start|>user\n<tool_response>\n{long_passages}\n</tool_response>")
    text, *_ = masks._step_text(np.array(ids), np.array([0, len(ids)]), strings)
    assert len(text) < len("".join(offline_tokenizer.convert_ids_to_tokens(ids))) / 2
    far = offline_tokenizer.encode("<|im_start|>" + "assistant" * 30 + "\n<tool_response>x</tool_response>")
    unsure = masks._id_blocks(np.array(far), np.array([0, len(far)]), strings)[4]
    assert unsure == {0}
    assert step_metrics_from_ids([(far, [1] * len(far))], strings) == _reference(
        offline_tokenizer, [(far, [1] * len(far))]
    )
    assert rows  # the realistic cases tokenize


@pytest.mark.parametrize("seed", range(3))
def test_the_span_invariant_counts_as_before(seed: int) -> None:
    rng = random.Random(seed)
    rows = []
    for _ in range(300):
        length = rng.randint(0, 40)
        # a value other than 0 and 1 counts as in the loss, as before
        mask = [rng.choice([0, 1, 1, 2]) for _ in range(length)]
        spans = _spans(rng, length)
        rows.append(({SPANS: format_spans(spans)} if spans is not None else {"other": 1}, mask))
        if spans is not None:
            assert mask_span_counts(mask, spans) == _old_mask_span_counts(mask, spans)
            assert mask_span_counts(np.array(mask), spans) == _old_mask_span_counts(mask, spans)
    assert span_step_metrics(rows) == _old_span_step_metrics(rows)
    arrays = [(e, np.array(m, dtype=np.int64)) for e, m in rows]
    assert span_step_metrics(arrays) == _old_span_step_metrics(rows)
    assert span_step_metrics([]) == {OUTSIDE: 0.0, MISSING: 0.0, UNRECORDED: 0.0}
