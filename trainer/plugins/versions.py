"""Which weights each trajectory of an async step was sampled from, and the checks on it (issue 40).

In verl's async modes (`trainer.v1.trainer_mode` colocate_async / separate_async) generation runs across weight
updates: a turn aborted for an update is resumed on the new weights (verl/workers/rollout/llm_server.py
`FullyAsyncLLMServerClient`), so one trajectory may hold tokens from several versions. verl tags each trajectory
with the oldest and newest version its turns were stamped with (`min_global_steps`/`max_global_steps`,
trainer/ppo/v1/agent_loop_tq.py), from the `global_steps` the rollout server returns with each turn. A server that
does not stamp leaves them None, and nothing in verl bounds staleness then; the probability-difference check of a
sync run means nothing off-policy. So the async replay buffer (trainer/plugins/sampler.py) logs per step

    versions/missing              trajectories without a version stamp (must be 0)
    versions/spanning             trajectories whose tokens come from two or more versions
    versions/staleness_worst_max  (global_steps - 1) - min_global_steps, the worst case over the step's trajectories
    versions/verified             versions the step's trajectories used whose weight sync the server verified
    versions/before_ledger        versions older than this process's rollout servers (a resumed run's restored
                                  trajectories: trainer/step_checks.py checks them against the earlier invocation)

and stops the run (StepCheckError) on a missing stamp, on staleness beyond what the replay buffer's drop rule
allows (a group submitted at step p is trained by step p + threshold - 1 and generated on weights >= p - 1, so the
worst staleness is threshold - 1), and, where the rollout servers keep a ledger (the buffer's `ledger_check`), on a
version no server verified: a ledger entry is the digest of the weights the server held after an update beside
that of what it was sent (the CPU runs' engine keeps one; verl's servers do not).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from searchrl.errors import StepCheckError

MISSING = "versions/missing"
SPANNING = "versions/spanning"
STALENESS_WORST_MAX = "versions/staleness_worst_max"
VERIFIED = "versions/verified"
BEFORE_LEDGER = "versions/before_ledger"

Ledger = Mapping[int, Mapping[str, str]]


def trajectory_versions(tags: Iterable[Mapping[str, Any]]) -> list[tuple[int | None, int | None]]:
    """(min, max) weights version of each non-padding trajectory, from its TransferQueue tags."""
    return [
        (tag.get("min_global_steps"), tag.get("max_global_steps"))
        for tag in tags
        if not tag.get("is_padding", False)
    ]


def version_step_metrics(versions: list[tuple[int | None, int | None]], global_steps: int) -> dict[str, int]:
    """`versions/missing`, `versions/spanning` and `versions/staleness_worst_max` of one step's trajectories."""
    stamped = [(lo, hi) for lo, hi in versions if lo is not None and hi is not None]
    return {
        MISSING: len(versions) - len(stamped),
        SPANNING: sum(1 for lo, hi in stamped if hi > lo),
        STALENESS_WORST_MAX: max(((global_steps - 1) - lo for lo, _ in stamped), default=0),
    }


def version_problems(metrics: Mapping[str, int], threshold: int | None) -> list[str]:
    """What is wrong with a step's version metrics; threshold None (verl's "no version control") bounds nothing."""
    problems = []
    if metrics[MISSING]:
        problems.append(
            f"{metrics[MISSING]} trajectories carry no weights version (the rollout server did not stamp its "
            "turns): staleness cannot be bounded"
        )
    if threshold is not None and metrics[STALENESS_WORST_MAX] > threshold - 1:
        problems.append(
            f"a trajectory was sampled {metrics[STALENESS_WORST_MAX]} updates behind the trained policy, beyond "
            f"max_off_policy_threshold={threshold} (at most {threshold - 1})"
        )
    return problems


def used_versions(versions: Iterable[tuple[int | None, int | None]]) -> set[int]:
    """Every version a trajectory may hold tokens from: its turns' stamps lie in [min, max]."""
    used: set[int] = set()
    for lo, hi in versions:
        if lo is not None and hi is not None:
            used.update(range(lo, hi + 1))
    return used


def ledger_check(used: set[int], ledgers: Mapping[str, Ledger]) -> tuple[dict[str, int], list[str]]:
    """Each used version against every rollout server's ledger: verified (held == sent), unverified, absent.

    A version older than a server's first entry predates the server process (a resumed run restores trajectories
    sampled by the previous invocation): counted in `versions/before_ledger`, not failed here."""
    problems: list[str] = []
    verified: set[int] = set()
    before: set[int] = set()
    if not ledgers:
        return {VERIFIED: 0, BEFORE_LEDGER: 0}, [
            "no rollout server ledger to check the weights versions against"
        ]
    for version in sorted(used):
        ok = True
        for server, ledger in sorted(ledgers.items()):
            entry = ledger.get(version)
            if entry is None:
                if ledger and version < min(ledger):
                    before.add(version)
                else:
                    problems.append(
                        f"weights version {version} is not in {server}'s ledger (no update loaded it)"
                    )
                ok = False
            elif entry.get("held") != entry.get("sent"):
                problems.append(
                    f"{server} holds weights {entry.get('held')} for version {version}, not the {entry.get('sent')} "
                    "it was sent"
                )
                ok = False
        if ok:
            verified.add(version)
    return {VERIFIED: len(verified), BEFORE_LEDGER: len(before)}, problems


def raise_on(problems: list[str], global_steps: int) -> None:
    if problems:
        raise StepCheckError(f"step {global_steps}: " + "; ".join(problems))


__all__ = [
    "BEFORE_LEDGER",
    "MISSING",
    "SPANNING",
    "STALENESS_WORST_MAX",
    "VERIFIED",
    "Ledger",
    "ledger_check",
    "raise_on",
    "trajectory_versions",
    "used_versions",
    "version_problems",
    "version_step_metrics",
]
