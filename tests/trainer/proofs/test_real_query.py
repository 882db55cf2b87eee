"""`make learn-cpu-real --stage query` (trainer/proofs/real_query.py): the reward, the overrides and the gate's wiring.

Fast: no verl process, no model. The reward's search goes to a localhost stand-in answering POST /retrieve in the
service's `return_scores: true` shape (retrieval/schemas.py); trainer/test_agent_loop.py runs the stage through
verl's agent loop and reward manager against the live BM25 service.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from searchrl.errors import ConfigError
from searchrl.trainer.cpu.scripted_agent_loop import (
    OPENINGS,
    scripted_opening,
    scripted_tool_call,
    search_call_opening,
)
from searchrl.trainer.plugins.generated_spans import LAST_TURN
from searchrl.trainer.proofs.real_gate import GateResult
from searchrl.trainer.proofs.real_query import OPENING, compute_score, holds_answer, parse_query, query_score

PASSAGES = {
    "the seventh seal": [
        '"The Seventh Seal"\nThe Seventh Seal is a 1957 film written and directed by Ingmar Bergman.'
    ],
}


@pytest.fixture
def service() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """POST /retrieve -> {"result": [[{"document": {"id", "contents"}, "score"}]]}; records each body."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            result = [
                [
                    {"document": {"id": str(i), "contents": text}, "score": 1.0}
                    for i, text in enumerate(PASSAGES.get(query.lower(), ['"Other"\nNothing relevant.']))
                ]
                for query in body["queries"]
            ]
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_the_opening_is_the_scripted_call_up_to_its_query_and_the_loop_knows_it_by_name() -> None:
    assert OPENING == '<tool_call>\n{"name": "search", "arguments": {"query_list": ["'
    assert scripted_tool_call("q").startswith(search_call_opening())
    assert OPENINGS["search_call"]() == OPENING
    config = {"engine_kwargs": {"searchrl": {"scripted_opening": "search_call"}}}
    assert scripted_opening(type("C", (), config)()) == OPENING
    assert scripted_opening(type("C", (), {"engine_kwargs": {"searchrl": {}}})()) == ""
    with pytest.raises(ValueError, match="not one of"):
        scripted_opening(type("C", (), {"engine_kwargs": {"searchrl": {"scripted_opening": "answer"}}})())


@pytest.mark.parametrize(
    ("turn", "query"),
    [
        ('The Seventh Seal"]}}\n</tool_call>', "The Seventh Seal"),
        ('a", "b"]}}</tool_call> and then some text', "a"),  # verl's hermes parser would run it too
        ('The Seventh Seal"]}}', None),  # never closes the tag
        ('The Seventh Seal"]}\n</tool_call>', None),  # malformed JSON
        ('  "]}}\n</tool_call>', None),  # an empty query
        ("", None),
    ],
)
def test_a_query_counts_only_when_the_call_closes_well_formed(turn: str, query: str | None) -> None:
    assert parse_query(turn) == query


def test_a_golden_answer_must_occur_as_whole_words() -> None:
    assert holds_answer(["Directed by Ingmar Bergman."], ["ingmar bergman"])
    assert not holds_answer(["Bergmanesque lighting"], ["Bergman"])
    assert not holds_answer(["anything"], ["", "  "])


def test_the_reward_pays_half_for_a_closed_call_and_all_when_its_query_retrieves_the_answer(
    service: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = service
    golden = ["Ingmar Bergman", "Bergman"]
    assert query_score('The Seventh Seal"]}}\n</tool_call>', golden, url) == (1.0, 1.0)
    assert query_score('your query"]}}\n</tool_call>', golden, url) == (0.5, 0.0)
    assert query_score("The Seventh Seal was", golden, url) == (0.0, 0.0)
    assert [b["queries"] for b in bodies] == [["The Seventh Seal"], ["your query"]]  # unclosed: no search
    assert {b["topk"] for b in bodies} == {3}


def test_verls_compute_score_reads_the_recorded_turn_and_needs_the_service(
    service: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = service
    info = {LAST_TURN: 'The Seventh Seal"]}}\n</tool_call>', "search_calls": 0, "search_failures": 0}
    out = compute_score("dev", "ignored text", {"target": ["Ingmar Bergman"]}, info, retrieval_url=url)
    assert out["score"] == 1.0 and out["retrieved"] == 1.0 and out["closed_call"] == 1.0
    with pytest.raises(ValueError, match="retrieval_url"):
        compute_score("dev", "", {"target": ["x"]}, info)
    with pytest.raises(ValueError, match="searchrl_tool_agent"):
        compute_score("dev", "", {"target": ["x"]}, {}, retrieval_url=url)


def test_the_query_stage_overrides_script_the_opening_not_the_call() -> None:
    from searchrl.trainer.proofs.real_learn import QUERY_REWARD_FN_PATH, REWARD_FN_PATH, learn_overrides

    own = learn_overrides("float32", 0, 96)
    query = learn_overrides("float32", 0, 48, stage="query", retrieval_url="http://127.0.0.1:1")
    assert f"reward.custom_reward_function.path={REWARD_FN_PATH}" in own
    assert "+actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_first_turn=true" in [
        o.lower() for o in own
    ]
    assert not any("scripted_opening" in o for o in own)
    assert f"reward.custom_reward_function.path={QUERY_REWARD_FN_PATH}" in query
    assert "+actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_opening=search_call" in query
    assert "+actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_first_turn=false" in [
        o.lower() for o in query
    ]
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=1" in query
    assert "+reward.custom_reward_function.reward_kwargs.retrieval_url=http://127.0.0.1:1" in query
    with pytest.raises(ConfigError, match="stage 2"):
        learn_overrides("float32", 0, 48, random_reward=0.5, stage="query")


def test_the_gate_line_names_the_stage_and_the_retrieving_share() -> None:
    own = GateResult(scores=[[1.0, 0.0]], questions=["q"], turns=[["a", "b"]])
    assert own.line().startswith("variance gate: 1 questions x 2 samples, reward mean 0.500")
    query = GateResult(scores=[[1.0, 0.5, 0.0, 0.0]], questions=["q"], turns=[["a"] * 4], stage="query")
    line = query.line()
    assert line.startswith("variance gate (query): 1 questions x 4 samples, reward mean 0.375")
    assert "query retrieves a golden answer 0.250" in line


def test_the_query_stages_own_tool_response_is_the_models_not_an_observation() -> None:
    """The query stage's response has no turn marker (the assistant header is in the prompt). The first run at
    stage 2 stopped at step 1 with `observation tokens in loss 44`: the model's own invented `<tool_response>`
    after the call it closed, read by the strict no-marker rule as an observation. With the agent loop's record
    of the generated range it is the model's own; without the record (or outside it) the strict rule stands."""
    from searchrl.trainer.plugins.masks import MODEL_TOOL_RESPONSE_TOKENS, mask_step_metrics

    pieces = [
        "<tool_call>",
        '{"q": "',
        "x",
        '"]}}',
        "</tool_call>",
        "<tool_response>",
        "made up",
        "</tool_response>",
    ]
    mask = [0, 0, 1, 1, 1, 1, 1, 1]
    own = mask_step_metrics([(pieces, mask, [(2, 8)])])
    assert own["loss/observation_tokens_in_loss"] == 0 and own[MODEL_TOOL_RESPONSE_TOKENS] == 3
    strict = mask_step_metrics([(pieces, mask)])
    assert strict["loss/observation_tokens_in_loss"] == 3 and strict[MODEL_TOOL_RESPONSE_TOKENS] == 0
    appended = mask_step_metrics([(pieces, [0] * 5 + [1] * 3, [(2, 5)])])  # environment text after the record
    assert appended["loss/observation_tokens_in_loss"] == 3
