"""`make learn-cpu-real`'s second stage (`--stage query`): close a search call whose opening is scripted, with a
query that finds the evidence.

SmolLM2-135M-Instruct never writes a tool call on its own (DESIGN.md 3d: 0 of 80 samples), but given the opening
of one, `<tool_call>\\n{"name": "search", "arguments": {"query_list": ["`, it writes a query and closes the call in
about a quarter of its samples (0.237), and the query retrieves a passage holding a golden answer in a few. That
is the behaviour a search agent lives on, and unlike stage 1's it is question-specific: what scores is a query
for *this* question.

The opening is environment: the agent loop appends it after the generation prompt with loss mask 0
(trainer/cpu/scripted_agent_loop.py, `scripted_opening`), the model writes the rest of the turn (mask 1), and the
trajectory ends there (`max_turns` 1: the call is not executed by verl; the reward searches itself). The reward
reads the recorded own turn (the agent loop's `LAST_TURN`: what the server generated after the opening):

- 0 unless `OPENING + turn` holds one well-formed search call (`<tool_call>{json}</tool_call>`, name `search`, a
  non-empty first query);
- 0.5 for such a call; 1.0 when the service's top-`TOPK` for its first query (the run's own BM25 service, as the
  first stage's tool uses it) holds a golden answer (SQuAD-normalised, word-bounded).

Why graded: the retrieval half alone is earned in ~2.5% of samples (DESIGN.md 3d: 0.131 mean for the half/half
reward over 0.237 closing), so a group of 8 would vary in ~18% of steps; the closing half keeps ~70% of groups
varying (the gate measures it), and the golden half is the question-specific part. `retrieved` in the reward's
extras (and in the gate's and probe's summaries) reports the golden half alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from searchrl.scoring import normalize_answer
from searchrl.trainer.cpu.scripted_agent_loop import search_call_opening
from searchrl.trainer.plugins import reward
from searchrl.trainer.plugins.generated_spans import LAST_TURN

OPENING = search_call_opening()  # '<tool_call>\n{"name": "search", "arguments": {"query_list": ["'
OPENING_NAME = "search_call"  # its name in the agent loop's OPENINGS (the override names it)
TOPK = 3
TIMEOUT_S = 30.0
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_query(turn: str) -> str | None:
    """The first query of the call `OPENING + turn`, when it closes as one well-formed search call; else None."""
    match = _CALL.search(OPENING + turn)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") != "search":
        return None
    arguments = call.get("arguments")
    queries = arguments.get("query_list") if isinstance(arguments, dict) else None
    if not isinstance(queries, list) or not queries or not isinstance(queries[0], str):
        return None
    query = queries[0].strip()
    return query or None


def holds_answer(passages: Iterable[str], golden: Iterable[str]) -> bool:
    """Whether any passage holds a golden answer (both SQuAD-normalised; whole words)."""
    text = f" {normalize_answer(' '.join(passages))} "
    return any(f" {a} " in text for a in (normalize_answer(g) for g in golden) if a)


def search(url: str, query: str, topk: int = TOPK) -> list[str]:
    """The service's top-`topk` passages for one query (POST /retrieve, synchronous: verl calls the reward from
    worker threads and event loops alike)."""
    import requests

    from searchrl.retrieval.client.hits import parse_result

    response = requests.post(
        f"{url.rstrip('/')}/retrieve",
        json={"queries": [query], "topk": topk, "return_scores": True},
        timeout=TIMEOUT_S,
    )
    response.raise_for_status()
    return [hit.contents for hit in parse_result(response.json(), 1)[0]]


def query_score(turn: str, golden: Iterable[str], url: str) -> tuple[float, float]:
    """(score, retrieved): 0 / 0.5 / 1.0 as the module docstring says, and the golden half alone (0 or 1)."""
    query = parse_query(turn)
    if query is None:
        return 0.0, 0.0
    found = holds_answer(search(url, query), golden)
    return (1.0 if found else 0.5), float(found)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    retrieval_url: str = "",
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score: the production reward's dict with `score` = query_score of the recorded own turn."""
    if not retrieval_url:
        raise ValueError("the query stage's reward needs reward_kwargs.retrieval_url (the run's service)")
    out = reward.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    turn = (extra_info or {}).get(LAST_TURN)
    if not isinstance(turn, str):
        raise ValueError(
            f"extra_info has no {LAST_TURN!r}: the trajectory was not run by searchrl_tool_agent "
            "(trainer/plugins/agent_loop.py), so its own turn is unknown"
        )
    score, retrieved = query_score(turn, reward.golden_answers(ground_truth), retrieval_url)
    return {**out, "score": score, "closed_call": float(score > 0), "retrieved": retrieved}


__all__ = [
    "OPENING",
    "OPENING_NAME",
    "TOPK",
    "compute_score",
    "holds_answer",
    "parse_query",
    "query_score",
    "search",
]
