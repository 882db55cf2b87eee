"""The one builder of the episode rules (searchrl/rollout.py `RolloutSpec.from_settings`) for trainer and infer."""

from __future__ import annotations

import pytest

from searchrl.infer.settings import InferSettings
from searchrl.rollout import ROLLOUT_DEFAULTS, RolloutSpec
from searchrl.trainer.settings import TrainSettings

# one non-default value per spec field, so a field the builder drops shows as a default
CHANGED = {
    "max_turns": 2,
    "max_prompt_tokens": 512,
    "max_response_tokens": 2048,
    "max_tokens_per_turn": 300,
    "max_parallel_calls": 3,
    "topk": 5,
    "passage_max_chars": 400,
    "prompt_format": "search-r1",
}


def test_every_spec_field_is_changed_here() -> None:
    assert set(CHANGED) == set(RolloutSpec.model_fields)
    assert all(getattr(ROLLOUT_DEFAULTS, k) != v for k, v in CHANGED.items())


def test_eval_settings_carry_every_field_of_the_spec() -> None:
    assert InferSettings(**CHANGED).rollout == RolloutSpec(**CHANGED)


def test_training_settings_carry_theirs_under_verls_names_and_keep_trainings_rules_for_the_rest() -> None:
    """The trainer has no per-turn cap, runs one call a turn and the searchrl format: the defaults eval shares."""
    s = TrainSettings(
        max_turns=2, max_prompt_length=512, max_response_length=2048, topk=5, passage_max_chars=400
    )
    trained = {
        k: CHANGED[k]
        for k in ("max_turns", "max_prompt_tokens", "max_response_tokens", "topk", "passage_max_chars")
    }
    assert s.rollout == RolloutSpec(**trained)
    assert InferSettings(**trained).rollout == s.rollout  # defaults agree: eval measures the task trained


def test_a_misnamed_field_fails_loudly_rather_than_falling_back_to_a_default() -> None:
    with pytest.raises(ValueError, match="max_prompt_len"):
        RolloutSpec.from_settings(TrainSettings(), max_prompt_tokens="max_prompt_len")
    with pytest.raises(ValueError, match="max_prompt"):
        RolloutSpec.from_settings(TrainSettings(), max_prompt="max_prompt_length")
