"""Deliberate bugs that only tests switch on, to prove the learning run's checks catch them (issue 31).

`SEARCHRL_TEST_SABOTAGE=<name>` in the environment of a CPU run (Ray workers inherit it) breaks one thing the
learning check must notice; each is a bug a peer shipped:

- `stale_sync`: the rollout server ignores weight updates and keeps sampling the initial policy (TRL #5312:
  vLLM kept stale weights after sleep mode). Caught by the exact weight fingerprint at the first sync after
  step 1, before step 2 samples (trainer/weight_sync/fingerprint.py); `training/rollout_probs_diff_max` would see it
  at step 2. On verl's own vLLM server (`make train-cpu ROLLOUT=vllm`) the workers load none of the buckets they
  receive (`stale_vllm_weights`): the fingerprint stops the run at the initial sync, before step 1.
- `flip_advantage`: GRPO's advantages come out with the wrong sign, so the update pushes away from reward.
  Caught by the reward curve and the probe.
- `shuffle_rewards`: each step's scores are joined to the wrong trajectories before the advantage (a prompt/answer
  or reward/trajectory mis-join), so the update is driven by noise with the reward's statistics. The reward and
  the probe share one question-agnostic objective (common answer letters), so this null says how much "rise" an
  update not driven by the reward produces; MIN_RISE and PROBE_MIN_RISE sit above it (trainer/proofs/learn.py).
- `observations_in_loss`: tool responses keep loss mask 1, so the policy is trained to predict retrieved text.
  Caught by the per-step count of mask-1 tokens inside tool responses (trainer/plugins/sampler.py).
- `no_version_stamps`: the rollout server returns its turns without the weights version they were sampled from
  (an engine that never stamps). An async
  run then cannot bound staleness; the async replay buffer's version check stops it at the first step
  (trainer/plugins/sampler.py).

Nothing in a user's run reads this variable unless it is set; an unknown name is refused, so a typo in a test
cannot pass silently as "no sabotage". A run with one switched on says so in its first line (`announcement`) and in
its error line (`name_in`), both from `searchrl train cpu` (searchrl/cli/train_cpu.py), so a sabotaged run's failure
is never read as a healthy run's; the tests hand each run they start only the variables it asks for
(tests/conftest.py `clean_environ`), so a switch left in a shell reaches no run that did not ask for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from searchrl.errors import ConfigError, SearchRLError

if TYPE_CHECKING:
    import torch

ENV = "SEARCHRL_TEST_SABOTAGE"
STALE_SYNC = "stale_sync"
FLIP_ADVANTAGE = "flip_advantage"
OBSERVATIONS_IN_LOSS = "observations_in_loss"
SHUFFLE_REWARDS = "shuffle_rewards"
NO_VERSION_STAMPS = "no_version_stamps"
NAMES = (STALE_SYNC, FLIP_ADVANTAGE, OBSERVATIONS_IN_LOSS, SHUFFLE_REWARDS, NO_VERSION_STAMPS)
SHUFFLE_SEED = 39  # the permutations repeat run to run (each verl invocation starts the sequence again)


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


def announcement(name: str) -> str:
    """The line a CPU run with sabotage `name` switched on starts with."""
    return f"SABOTAGE {name} is switched on ({ENV}={name}): this run is meant to fail; unset {ENV} for a real run"


def name_in(exc: BaseException, name: str) -> None:
    """Name sabotage `name` in how `exc` will be shown: a SearchRLError's message (the one `error: ...` line
    `searchrl` prints) starts with it; any other exception, a bug that keeps its traceback, gets it as a note."""
    tag = f"SABOTAGE {name} was switched on ({ENV})"
    if isinstance(exc, SearchRLError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{tag}: {exc.args[0]}",)
    else:
        exc.add_note(tag)


# Both advantage sabotages wrap the function verl's GRPO path looks up on `core_algos` at each call
# (verl/trainer/ppo/ray_trainer.py `compute_advantage`, reached from the v1 trainer's `_compute_advantage` through
# v1/utils.py `compute_advantage_for_multi_trajectories`); tests/trainer/proofs/test_learning_checks.py drives that path
# with verl's own code, so a verl that routes GRPO elsewhere fails a test instead of making these silent no-ops.
_WRAPPED = "_searchrl_sabotage"


def flip_advantages() -> None:
    """Wrap verl's GRPO advantage so it returns the negated advantages and returns (the trainer process)."""
    from verl.trainer.ppo import core_algos

    original = core_algos.compute_grpo_outcome_advantage
    if getattr(original, _WRAPPED, None):
        return

    def flipped(*args, **kwargs):  # type: ignore[no-untyped-def]
        advantages, returns = original(*args, **kwargs)
        return -advantages, -returns

    setattr(flipped, _WRAPPED, FLIP_ADVANTAGE)
    core_algos.compute_grpo_outcome_advantage = flipped


def misjoin(n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of range(n) that moves every index (one n-cycle): `scores[perm]` gives each trajectory
    another trajectory's score, never its own, so no trajectory keeps the signal of its own reward."""
    import torch

    order = torch.randperm(n, generator=generator)
    perm = torch.empty_like(order)
    perm[order] = order.roll(1)  # order[i] takes the score of order[i - 1]
    return perm


def shuffle_rewards(seed: int = SHUFFLE_SEED) -> None:
    """Wrap verl's GRPO advantage so each step's token-level rewards are permuted across its trajectories first.

    Whole rows move, so each trajectory is credited with another's score (GRPO sums a row's token rewards and
    masks the result with the trajectory's own response mask). The trainer's reward metrics (`critic/score/*`)
    and verl's rollout dumps still show each trajectory's true score: only the update is misled.
    """
    import torch
    from verl.trainer.ppo import core_algos

    original = core_algos.compute_grpo_outcome_advantage
    if getattr(original, _WRAPPED, None):
        return
    generator = torch.Generator().manual_seed(seed)

    def shuffled(token_level_rewards, *args, **kwargs):  # type: ignore[no-untyped-def]
        perm = misjoin(token_level_rewards.shape[0], generator)
        return original(token_level_rewards[perm], *args, **kwargs)

    setattr(shuffled, _WRAPPED, SHUFFLE_REWARDS)
    core_algos.compute_grpo_outcome_advantage = shuffled


def stale_vllm_weights() -> bool:
    """`stale_sync` on verl's own vLLM server (the CPU vLLM run, trainer/cpu/vllm_shims.py, in each vLLM worker): the
    worker extension receives every bucket verl sends and loads none (verl's `vLLMColocateWorkerExtension.
    _update_weights`, workers/rollout/vllm_rollout/utils.py:367-415, becomes a no-op), so the engine keeps the
    weights it started with, as after TRL #5312. Our fingerprint check (trainer/weight_sync/vllm_sync.py) must stop the run at
    the first sync."""
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    if getattr(vLLMColocateWorkerExtension._update_weights, _WRAPPED, None):
        return True

    def ignore_update(self, weights, peft_config, base_sync_done):  # type: ignore[no-untyped-def]
        return None

    setattr(ignore_update, _WRAPPED, STALE_SYNC)
    vLLMColocateWorkerExtension._update_weights = ignore_update  # type: ignore[method-assign]
    return True


__all__ = [
    "ENV",
    "FLIP_ADVANTAGE",
    "NAMES",
    "NO_VERSION_STAMPS",
    "OBSERVATIONS_IN_LOSS",
    "SHUFFLE_REWARDS",
    "SHUFFLE_SEED",
    "STALE_SYNC",
    "active",
    "announcement",
    "current",
    "flip_advantages",
    "misjoin",
    "name_in",
    "shuffle_rewards",
    "stale_vllm_weights",
]
