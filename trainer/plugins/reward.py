"""The verl reward function: exact match on the last <answer>, plus F1, format validity and search counts.

verl loads it through `reward.custom_reward_function.path=pkg://searchrl.trainer.plugins.reward` and `.name=compute_score`
(trainer/overrides.py). With a custom function set, verl routes *every* data source here, so a user's own
`data_source` scores the same way instead of hitting `default_compute_score`'s NotImplementedError.

For the seven `searchR1_*` sources the score equals verl's `search_r1_like_qa_em.compute_score` (tests compare
them): both use searchrl/scoring.py's rules. verl's NaiveRewardManager takes `score` as the reward and logs every
other key of the returned dict as `reward_extra_info`; every key must be present for every sample because verl
stacks them into arrays, so failures and missing values are numbers, never absent.

Search failures stop the run. Every failed search is an observation the policy learns from, so against an
overloaded service it learns not to search, and the run still "succeeds". The reward function is where the tool's
per-trajectory counters arrive, so it keeps a sliding window of the last `failure_window` searches (per reward
process: each of verl's agent-loop workers scores its own trajectories) and raises SearchFailureRateError when
more than `max_failure_rate` of them failed. verl passes both as `reward.custom_reward_function.reward_kwargs`
(trainer/overrides.py); the exception propagates through Ray and ends `main_ppo` with the message.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from searchrl.errors import SearchFailureRateError
from searchrl.prompt import POLICY_FAILURES as _POLICY_FAILURES
from searchrl.scoring import score_response
from searchrl.trainer.plugins.metrics import FAILURE_KINDS

log = logging.getLogger(__name__)

# The seven Search-R1 sources verl's default_compute_score routes to search_r1_like_qa_em.
SEARCH_R1_SOURCES = frozenset(
    f"searchR1_{name}"
    for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)
# Per-trajectory counters the search tool keeps in the agent loop's extra_fields (trainer/plugins/tool.py); verl merges
# them into `extra_info` before calling the reward, which is how tool metrics reach the training logs.
TOOL_COUNTERS = ("search_calls", "search_failures", "search_latency_s")
# Comma-separated failure kinds of one trajectory ("timeout,connect"); a string, because verl stacks every
# extra field into a numpy object array and lists of equal length would broadcast into a 2-D array.
FAILURE_KINDS_FIELD = FAILURE_KINDS
# failure kinds the model causes; not counted against the service (one definition, shared with eval)
POLICY_FAILURES = _POLICY_FAILURES


class FailureWindow:
    """The outcome of the last `size` searches; `check` raises once their failure share exceeds `max_rate`."""

    def __init__(self, size: int, max_rate: float) -> None:
        self.size = size
        self.max_rate = max_rate
        self._outcomes: deque[str] = deque(maxlen=size)  # "" = success, else the failure kind
        self._lock = threading.Lock()  # verl may score in a thread pool

    def add(self, calls: int, failures: int, kinds: list[str]) -> None:
        failures = min(max(failures, 0), max(calls, 0))
        kinds = (kinds + ["unknown"] * failures)[:failures]
        with self._lock:
            self._outcomes.extend(kinds)
            self._outcomes.extend([""] * (calls - failures))

    def check(self) -> None:
        with self._lock:
            outcomes = list(self._outcomes)
        if self.max_rate <= 0 or len(outcomes) < self.size:
            return
        failed = Counter(o for o in outcomes if o)
        rate = sum(failed.values()) / len(outcomes)
        if rate > self.max_rate:
            kinds = ", ".join(f"{kind} x{n}" for kind, n in failed.most_common())
            raise SearchFailureRateError(
                f"{rate:.1%} of the last {len(outcomes)} searches failed ({kinds}), above the "
                f"{self.max_rate:.0%} limit: stopping rather than teaching the policy that search does not work; "
                "check the retrieval service (`searchrl health URL`, its /metrics) or raise "
                "SEARCHRL_TRAIN_MAX_SEARCH_FAILURE_RATE"
            )


_windows: dict[tuple[int, float], FailureWindow] = {}


def get_failure_window(size: int, max_rate: float) -> FailureWindow:
    """This process's window for the given limits (one per reward worker process)."""
    key = (int(size), float(max_rate))
    if key not in _windows:
        _windows[key] = FailureWindow(*key)
    return _windows[key]


def _kinds(value: Any) -> list[str]:
    return [k for k in str(value).split(",") if k] if isinstance(value, str) else []


def golden_answers(ground_truth: Any) -> list[str]:
    """The target answers from `reward_model.ground_truth` ({"target": [...]}, a list, or a bare string)."""
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth.get("target", [])
    if isinstance(ground_truth, str):
        return [ground_truth]
    if ground_truth is None:
        return []
    return [str(g) for g in list(ground_truth)]  # lists and numpy arrays (parquet round trip)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    max_failure_rate: float | None = None,
    failure_window: int = 200,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's compute_score signature; `score` is the reward, the other keys are logged metrics.

    With `max_failure_rate` (0 < rate <= 1; None or 0 disables), raises SearchFailureRateError when more than
    that share of this process's last `failure_window` searches failed (module docstring).
    """
    result = score_response(solution_str, golden_answers(ground_truth))
    info = extra_info or {}
    if max_failure_rate:
        window = get_failure_window(failure_window, max_failure_rate)
        calls, failures = info.get("search_calls"), info.get("search_failures")
        if isinstance(calls, int | float) and calls > 0:
            kinds = _kinds(info.get(FAILURE_KINDS_FIELD))
            # Malformed arguments are the policy's mistake, not the service's: they never reach /retrieve.
            policy = sum(k in POLICY_FAILURES for k in kinds)
            failed = int(failures) if isinstance(failures, int | float) else 0
            window.add(int(calls) - policy, failed - policy, [k for k in kinds if k not in POLICY_FAILURES])
        window.check()
    out = {
        "score": float(result.em),
        "em": float(result.em),
        "f1": float(result.f1),
        "format_valid": float(result.format_valid),
        "has_answer": float(result.answer is not None),
    }
    for key in TOOL_COUNTERS:
        value = info.get(key)
        out[key] = float(value) if isinstance(value, int | float) else 0.0
    return out


__all__ = [
    "FAILURE_KINDS_FIELD",
    "POLICY_FAILURES",
    "SEARCH_R1_SOURCES",
    "TOOL_COUNTERS",
    "FailureWindow",
    "compute_score",
    "get_failure_window",
    "golden_answers",
]
