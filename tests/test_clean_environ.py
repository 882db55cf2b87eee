"""clean_environ() (tests/conftest.py): the one filter behind the autouse clean_env and the environment of every run a
session- or module-scoped fixture starts (issue 53 item 5)."""

from __future__ import annotations

import os

from tests.conftest import clean_environ


def test_clean_environ_drops_what_a_shell_may_leave_and_adds_what_is_asked(monkeypatch):
    for name, value in {
        "SEARCHRL_TEST_SABOTAGE": "observations_in_loss",  # a sabotage switch
        "SEARCHRL_SABOTAGE_TESTS": "1",  # an opt-in gate
        "SEARCHRL_RETRIEVAL_TOPK": "7",  # any knob
        "RETRIEVAL_API_KEY": "secret",  # a secret
        "MODEL_NAME": "Qwen/Qwen2.5-7B",  # a recipe name
    }.items():
        monkeypatch.setenv(name, value)
    env = clean_environ()
    assert not {n for n in env if n.startswith("SEARCHRL_")} and "RETRIEVAL_API_KEY" not in env
    assert "MODEL_NAME" not in env and env["PATH"] == os.environ["PATH"]
    asked = clean_environ({"SEARCHRL_TEST_SABOTAGE": "stale_sync"})
    assert asked == {**env, "SEARCHRL_TEST_SABOTAGE": "stale_sync"}
    # a copy: this process keeps its own
    assert os.environ["SEARCHRL_TEST_SABOTAGE"] == "observations_in_loss"


def test_clean_env_leaves_a_test_what_clean_environ_gives():
    assert dict(os.environ) == clean_environ()
