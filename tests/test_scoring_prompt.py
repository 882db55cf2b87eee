"""The shared scorer agrees with verl's reward, and the prompt teaches the format verl's hermes parser reads."""

from __future__ import annotations

import json

import pytest

from searchrl.prompt import (
    SEARCH_TOOL_SCHEMA,
    build_user_prompt,
    format_observation,
    parse_tool_calls,
    queries_from_arguments,
    split_title,
)
from searchrl.scoring import (
    cover_match,
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    score_response,
)

CASES = [
    ("<think>x</think><answer> Ingmar Bergman </answer>", ["Ingmar Bergman", "Bergman"]),
    ("<answer>The Bergman.</answer>", ["Bergman"]),
    ("<answer>wrong</answer> then <answer>Bergman</answer>", ["Bergman"]),
    ("<answer>Bergman</answer> then <answer>wrong</answer>", ["Bergman"]),
    ("no tags Bergman", ["Bergman"]),
    ("<answer>" + "</answer><answer>".join(["Bergman"] * 12) + "</answer>", ["Bergman"]),
    ("<answer>24</answer>", ["24", "twenty-four"]),
    ("<answer>Twenty four</answer>", ["twenty-four"]),
]


@pytest.mark.parametrize(("response", "golden"), CASES)
def test_em_matches_verl(response: str, golden: list[str]) -> None:
    from verl.utils.reward_score import search_r1_like_qa_em

    ours = score_response(response, golden).em
    theirs = search_r1_like_qa_em.compute_score(response, {"target": golden})
    assert ours == pytest.approx(float(theirs))
    assert normalize_answer(golden[0]) == search_r1_like_qa_em.normalize_answer(golden[0])


def test_cover_match_finds_the_answer_as_whole_words_inside_a_sentence() -> None:
    assert cover_match("In mathematics, a hyperbola is a type of smooth curve", ["Hyperbola"]) == 1.0
    assert cover_match("The subject of Sun Yat-sen was a physician", "Sun Yat-sen") == 1.0
    assert cover_match("Denverite", ["Denver"]) == 0.0  # whole words only
    assert cover_match("anything", [""]) == 0.0 and cover_match("", ["Zeus"]) == 0.0
    assert exact_match("In mathematics, a hyperbola is a curve", ["Hyperbola"]) == 0.0  # EM stays strict


def test_f1_and_format() -> None:
    assert f1_score("Ingmar Bergman", ["Bergman"]) == pytest.approx(2 / 3)
    assert f1_score("Paris", ["Bergman"]) == 0.0
    assert exact_match("the  Bergman!", "bergman") == 1.0
    s = score_response("<answer>Bergman</answer>", ["Bergman"])
    assert s.format_valid and s.em == 1.0 and s.f1 == 1.0
    assert not score_response("<answer>a</answer><answer>Bergman</answer>", ["Bergman"]).format_valid
    assert extract_answer("none") is None


def test_prompt_teaches_the_format_the_parser_reads() -> None:
    prompt = build_user_prompt("Who directed The Seventh Seal")
    assert prompt.endswith("Question: Who directed The Seventh Seal?\n")
    start = prompt.index("<tool_call>")
    example = prompt[start : prompt.index("</tool_call>", start) + len("</tool_call>")]
    parsed = parse_tool_calls(example)
    assert parsed.errors == [] and parsed.calls[0].name == SEARCH_TOOL_SCHEMA["function"]["name"]
    assert queries_from_arguments(parsed.calls[0].arguments) == ["your query"]
    assert set(parsed.calls[0].arguments) == set(SEARCH_TOOL_SCHEMA["function"]["parameters"]["properties"])
    assert "<answer>" in prompt and "<tool_call>" not in build_user_prompt("q", search=False)


def test_parse_tool_calls_matches_verl_hermes_parser() -> None:
    import asyncio

    from verl.experimental.agent_loop.tool_parser import HermesToolParser

    text = (
        '<think>t</think><tool_call>{"name": "search", "arguments": {"query_list": ["a", "b"]}}</tool_call>'
        "<tool_call> Seventh Seal director </tool_call>"
    )
    ours = parse_tool_calls(text)
    assert [c.arguments for c in ours.calls] == [{"query_list": ["a", "b"]}]
    assert len(ours.errors) == 1 and "not valid JSON" in ours.errors[0]

    class _Tok:
        def decode(self, ids: list[int]) -> str:
            return text

    _, theirs = asyncio.run(HermesToolParser(_Tok()).extract_tool_calls([1]))
    assert [(f.name, json.loads(f.arguments)) for f in theirs] == [(c.name, c.arguments) for c in ours.calls]


@pytest.mark.parametrize(
    ("args", "queries"),
    [({"query_list": [" a ", ""]}, ["a"]), ({"query": "b"}, ["b"])],
)
def test_queries_from_arguments(args: dict, queries: list[str]) -> None:
    assert queries_from_arguments(args) == queries


@pytest.mark.parametrize("args", [{}, {"query_list": []}, {"query_list": [" "]}, {"query_list": 3}])
def test_queries_from_arguments_rejects(args: dict) -> None:
    with pytest.raises(ValueError, match="query_list"):
        queries_from_arguments(args)


def test_observation_format() -> None:
    docs = ['"The Seventh Seal"\nA 1957 film by Ingmar Bergman.', '"Chess"\nA board game.']
    assert split_title(docs[0]) == ("The Seventh Seal", "A 1957 film by Ingmar Bergman.")
    one = format_observation(["q"], [docs])
    assert one.splitlines() == [
        "Doc 1 (Title: The Seventh Seal) A 1957 film by Ingmar Bergman.",
        "Doc 2 (Title: Chess) A board game.",
    ]
    two = format_observation(["q1", "q2"], [docs[:1], docs[1:]])
    assert (
        two.startswith("Query: q1\nDoc 1 (Title: The Seventh Seal)")
        and "Query: q2\nDoc 1 (Title: Chess)" in two
    )
    capped = format_observation(["q"], [docs], max_chars=30)
    assert len(capped) <= 33 and capped.endswith("...")
    assert format_observation(["q"], [[]]) == "search returned no results"
