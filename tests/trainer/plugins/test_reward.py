"""trainer/plugins/reward.py against verl's own Search-R1 scorer and routing."""

from __future__ import annotations

import numpy as np
import pytest

from searchrl.trainer.plugins.reward import SEARCH_R1_SOURCES, TOOL_COUNTERS, compute_score, golden_answers

GOLD = {"target": ["Ingmar Bergman", "Bergman"]}

RESPONSES = [
    "<think>x</think><answer> Ingmar Bergman </answer>",
    "<answer>ingmar bergman.</answer>",
    "<answer>The Bergman</answer>",
    "<answer>Akira Kurosawa</answer>",
    "<answer>Kurosawa</answer> then <answer>Bergman</answer>",  # the last answer counts
    "<answer>Bergman</answer> then <answer>Kurosawa</answer>",
    "no answer tags at all: Bergman",
    "<answer></answer>",
    "<answer>Bergman</answer>" * 11,  # sprayed tags earn a quarter
    "<answer>Bergman</answer>" * 10,
    "<answer>Bergman",  # unclosed
    "<tool_response>\nDoc 1 (Title: The Seventh Seal) ...\n</tool_response><answer>Bergman</answer>",
]


def test_verl_routes_all_seven_sources_to_the_search_r1_scorer():
    from verl.utils.reward_score import default_compute_score

    for source in SEARCH_R1_SOURCES:
        assert default_compute_score(source, "<answer>Bergman</answer>", GOLD) == 1
    with pytest.raises(NotImplementedError):  # why we route every source through our function instead
        default_compute_score("searchR1_mywiki", "<answer>Bergman</answer>", GOLD)


@pytest.mark.parametrize("response", RESPONSES)
@pytest.mark.parametrize("source", sorted(SEARCH_R1_SOURCES))
def test_score_equals_verl_search_r1_em(response, source):
    from verl.utils.reward_score import default_compute_score

    ours = compute_score(source, response, GOLD)
    assert ours["score"] == float(default_compute_score(source, response, GOLD))


def test_other_sources_score_the_same_way_instead_of_crashing():
    assert compute_score("searchR1_mywiki", "<answer>Bergman</answer>", GOLD)["score"] == 1.0
    assert compute_score("my_own_qa", "<answer>Kurosawa</answer>", GOLD)["score"] == 0.0


def test_extra_metrics_f1_format_and_tool_counters():
    out = compute_score(
        "searchR1_nq",
        "<answer>Ingmar Bergmann</answer>",
        GOLD,
        extra_info={"search_calls": 2, "search_failures": 1, "search_latency_s": 0.25},
    )
    assert out["score"] == 0.0 and out["em"] == 0.0
    assert out["f1"] == pytest.approx(0.5)  # "ingmar" of "ingmar bergmann" matches "ingmar bergman"
    assert out["format_valid"] == 1.0 and out["has_answer"] == 1.0
    assert (out["search_calls"], out["search_failures"], out["search_latency_s"]) == (2.0, 1.0, 0.25)

    sprayed = compute_score("searchR1_nq", "<answer>Bergman</answer>" * 11, GOLD)
    assert sprayed["score"] == 0.25 and sprayed["format_valid"] == 0.0


def test_every_key_present_for_every_sample():
    # verl stacks reward_extra_info per key across the batch: a missing key would raise KeyError there.
    keys = {tuple(sorted(compute_score("x", r, GOLD, extra_info={}).keys())) for r in RESPONSES}
    assert len(keys) == 1
    assert set(TOOL_COUNTERS) <= set(next(iter(keys)))
    no_info = compute_score("x", "no answer", GOLD)
    assert no_info["has_answer"] == 0.0 and no_info["search_calls"] == 0.0


def test_golden_answers_accepts_parquet_shapes():
    assert golden_answers({"target": np.array(["a", "b"], dtype=object)}) == ["a", "b"]
    assert golden_answers(["a"]) == ["a"]
    assert golden_answers("a") == ["a"]
    assert golden_answers(None) == []


@pytest.fixture(autouse=True)
def _fresh_failure_windows(monkeypatch):
    import searchrl.trainer.plugins.reward

    monkeypatch.setattr(searchrl.trainer.plugins.reward, "_windows", {})


def _trajectory(calls: int, failures: int, kinds: str = "") -> dict:
    info = {"search_calls": calls, "search_failures": failures, "search_latency_s": 0.1}
    if kinds:
        info["search_failure_kinds"] = kinds
    return info


def _score(info: dict, **limits):
    return compute_score("searchR1_nq", "<answer>x</answer>", {"target": ["x"]}, info, **limits)


def test_failure_rate_over_the_window_stops_the_run_with_the_kinds():
    from searchrl.errors import SearchFailureRateError

    limits = {"max_failure_rate": 0.05, "failure_window": 40}
    for _ in range(19):  # 38 good searches: the window is not full yet
        _score(_trajectory(2, 0), **limits)
    _score(_trajectory(2, 2, "timeout,connect"), **limits)  # 2 of 40 = 5%: at the limit, not above
    with pytest.raises(SearchFailureRateError) as caught:
        _score(_trajectory(1, 1, "timeout"), **limits)  # 3 of the last 40 = 7.5%
    message = str(caught.value)
    assert "7.5% of the last 40 searches failed (timeout x2, connect x1)" in message
    assert "SEARCHRL_TRAIN_MAX_SEARCH_FAILURE_RATE" in message


def test_old_failures_leave_the_window_and_bad_arguments_do_not_count():
    limits = {"max_failure_rate": 0.1, "failure_window": 20}
    _score(_trajectory(2, 2, "http_503,http_503"), **limits)
    for _ in range(30):  # the policy's malformed calls are not the service's failures
        _score(_trajectory(2, 1, "bad_arguments"), **limits)
    for _ in range(20):
        _score(_trajectory(1, 0), **limits)  # pushes the two 503s out of the window
    _score(_trajectory(1, 1, "http_503"), **limits)  # 1 of 20 = 5% <= 10%


def test_failure_rate_check_is_off_without_the_limit():
    for _ in range(300):
        assert _score(_trajectory(1, 1, "connect"))["search_failures"] == 1.0


def test_verl_hands_the_limits_to_the_reward_function(compose, tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from searchrl.errors import SearchFailureRateError
    from searchrl.trainer.overrides import render_overrides
    from searchrl.trainer.settings import TrainSettings

    settings = TrainSettings(data_dir=tmp_path, max_search_failure_rate=0.5, search_failure_window=10)
    fn = get_custom_reward_fn(compose(render_overrides(settings)))
    with pytest.raises(
        SearchFailureRateError, match="100.0% of the last 10 searches failed \\(connect x10\\)"
    ):
        for _ in range(10):
            fn(
                data_source="searchR1_nq",
                solution_str="<answer>x</answer>",
                ground_truth={"target": ["x"]},
                extra_info=_trajectory(1, 1, "connect"),
            )
