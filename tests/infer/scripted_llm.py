"""The scripted OpenAI-compatible server the infer tests replay fixed turns through.

The server itself ships in the package (`searchrl.infer.scripted`: `searchrl smoke` uses it as a pipeline check);
the tests give it a `Replay` policy: `{model: {question_key: [turn 1 text, turn 2 text, ...]}}`, the script
picked by the key found in the question's turn and the turn by how many assistant turns the prompt holds.
`app.state.requests` keeps every request body; `app.state.fail_after = N` answers 503 after N requests.
"""

from __future__ import annotations

from fastapi import FastAPI

from searchrl.infer.scripted import Replay
from searchrl.infer.scripted import create_scripted_app as _create

Scripts = dict[str, dict[str, list[str]]]  # model -> question key -> turns


def create_scripted_app(scripts: Scripts) -> FastAPI:
    return _create(Replay(scripts))
