"""Result documents shaped like `searchrl eval`'s, built in memory for the compare/report unit tests."""

from __future__ import annotations

import copy
from typing import Any

from searchrl.infer.summary import summarize


def record(ds: str, i: int, em: float, *, fail: str | None = None, obs: str = "") -> dict[str, Any]:
    """One question's record: `fail` = a search failure kind on it; `obs` = the observation it was shown."""
    transcript = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<tool_call>"}]
    if obs:
        transcript.append({"role": "tool", "content": obs})
    return {
        "id": f"{ds}-{i}",
        "data_source": ds,
        "question": f"question {i} of {ds}?",
        "golden_answers": ["x"],
        "answer": "x" if em else "y",
        "em": em,
        "reward": em,
        "f1": em,
        "format_valid": True,
        "searches": 1,
        "queries": 1,
        "search_failures": 1 if fail else 0,
        "failure_kinds": {fail: 1} if fail else {},
        "malformed_calls": 0,
        "dropped_calls": 0,
        "length_truncated_turns": 0,
        "turns": 2,
        "stop_reason": "answer",
        "error": None,
        "latency_s": 0.1,
        "transcript": transcript,
    }


PROTOCOL: dict[str, Any] = {
    "model": "org/base-3b",
    "engine": "server",
    "api": "completions",
    "chat_template_sha256": "c" * 64,
    "search": True,
    "retrieval": {"urls": ["http://w"], "backend": "dense", "corpus": "wiki18", "checksums": {}, "info": {}},
    "rollout": {"max_turns": 4, "topk": 3, "prompt_format": "searchrl", "max_tokens_per_turn": None},
    "max_observation_chars": 2784,
    "temperature": 0.0,
    "top_p": 1.0,
    "seed": 0,
    "stop_after_tool_call": False,
    "malformed_feedback": False,
    "prompt_format": "searchrl",
    "prompt_version": "v1",
    "max_failure_rate": 0.02,
    "qa": {"source": "dev", "sha256": "q" * 64, "datasets": None, "limit": None, "sample_seed": 0, "n": 0},
    "protocol_hash": "h",
}


def run(label: str, questions: list[dict[str, Any]], **protocol: Any) -> dict[str, Any]:
    """A result document over `questions`, summarised by the real `summarize`; `protocol` overrides fields."""
    p = copy.deepcopy(PROTOCOL)
    for key, value in protocol.items():
        target = p
        *parents, leaf = key.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    p["label"] = label
    p["qa"]["n"] = len(questions)
    summary, per_dataset = summarize(questions, max_failure_rate=p["max_failure_rate"])
    return {"protocol": p, "summary": summary, "per_dataset": per_dataset, "questions": questions}


def ems(ds: str, pattern: str, *, fails: set[int] = frozenset(), obs: str = "") -> list[dict[str, Any]]:
    """Records from a pattern of 1/0 characters (one per question); `fails` = indices with a search failure."""
    return [
        record(ds, i, float(c == "1"), fail="http_503" if i in fails else None, obs=obs)
        for i, c in enumerate(pattern)
    ]
