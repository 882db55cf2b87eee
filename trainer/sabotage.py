"""Three deliberate bugs that only tests switch on, to prove the learning run's checks catch them (issue 31).

`SEARCHRL_TEST_SABOTAGE=<name>` in the environment of a CPU run (Ray workers inherit it) breaks one thing the
learning check must notice; each is a bug a peer shipped:

- `stale_sync`: the rollout server ignores weight updates and keeps sampling the initial policy (TRL #5312:
  vLLM kept stale weights after sleep mode). Caught by the exact weight fingerprint at the first sync after
  step 1, before step 2 samples (trainer/weight_fingerprint.py); `training/rollout_probs_diff_max` would see it
  at step 2.
- `flip_advantage`: GRPO's advantages come out with the wrong sign, so the update pushes away from reward.
  Caught by the reward curve and the probe.
- `observations_in_loss`: tool responses keep loss mask 1, so the policy is trained to predict retrieved text.
  Caught by the per-step count of mask-1 tokens inside tool responses (trainer/sampler.py).

Nothing in a user's run reads this variable unless it is set; an unknown name is refused, so a typo in a test
cannot pass silently as "no sabotage".
"""

from __future__ import annotations

import os

from searchrl.errors import ConfigError

ENV = "SEARCHRL_TEST_SABOTAGE"
STALE_SYNC = "stale_sync"
FLIP_ADVANTAGE = "flip_advantage"
OBSERVATIONS_IN_LOSS = "observations_in_loss"
NAMES = (STALE_SYNC, FLIP_ADVANTAGE, OBSERVATIONS_IN_LOSS)


def current() -> str | None:
    """The switched-on sabotage, or None."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if name not in NAMES:
        raise ConfigError(f"{ENV}={name!r} is not one of {', '.join(NAMES)}")
    return name


def active(name: str) -> bool:
    return current() == name


def flip_advantages() -> None:
    """Wrap verl's GRPO advantage so it returns the negated advantages and returns (the trainer process)."""
    from verl.trainer.ppo import core_algos

    original = core_algos.compute_grpo_outcome_advantage
    if getattr(original, "_searchrl_flipped", False):
        return

    def flipped(*args, **kwargs):  # type: ignore[no-untyped-def]
        advantages, returns = original(*args, **kwargs)
        return -advantages, -returns

    flipped._searchrl_flipped = True  # type: ignore[attr-defined]
    core_algos.compute_grpo_outcome_advantage = flipped


__all__ = [
    "ENV",
    "FLIP_ADVANTAGE",
    "NAMES",
    "OBSERVATIONS_IN_LOSS",
    "STALE_SYNC",
    "active",
    "current",
    "flip_advantages",
]
