"""The line a passing run ends with (issue 52 item 2): `step_checks.checks_line` on step rows and log text as verl
and the rollout adapters print them, each figure, and a failure for every check that never ran; the adapters'
match lines (hf, vLLM, sglang) and the hf engine's cross-check that every update it logged was compared."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
import torch

from searchrl.errors import SmokeCheckError, StepCheckError
from searchrl.trainer.cpu.hf_log import UPDATE_LINE
from searchrl.trainer.proofs.train_cpu import hf_sync_problems, run_checks_line
from searchrl.trainer.step_checks import (
    PROB_DIFF_MEAN,
    STALENESS_WORST_MAX,
    StepRow,
    checks_line,
    parse_steps,
    sync_match_line,
    sync_matches,
)
from tests.trainer.proofs.test_train_cpu import STEP_LINE

WORKER = "\x1b[36m(WorkerDict pid=9599)\x1b[0m "
# The checks line as a run prints it; the end-to-end tests read their run's figures with it.
CHECKS = re.compile(
    r"^checks: (?P<syncs>\d+) syncs fingerprinted, all matched; sync (?:max prob diff|mean prob diff \(bf16\) up "
    r"to) (?P<diff>\S+) over (?P<covered>\d+)(?: of (?P<steps>\d+))? steps(?: \(staleness 0\))?; (?P<in_loss>\d+) "
    r"observation tokens in the loss \((?P<seen>\d+) seen\); (?P<outside>\d+) mask tokens outside the generated "
    r"spans, (?P<missing>\d+) generated tokens unmasked, (?P<unrecorded>\d+) trajectories unrecorded$"
)


def checks_figures(stdout: str) -> dict[str, float]:
    """The figures of the one checks line a run printed (asserts there is exactly one)."""
    found = [m for m in map(CHECKS.match, stdout.splitlines()) if m]
    assert len(found) == 1, [line for line in stdout.splitlines() if line.startswith("checks")]
    return {key: float(value) for key, value in found[0].groupdict().items() if value is not None}


SERVER = "\x1b[36m(HFGenerateServer pid=9650)\x1b[0m "


def _rows(diffs: list[float], **metrics: float) -> list[StepRow]:
    """Steps 1.. as verl logs them (test_train_cpu's recorded line), each with its max prob diff and `metrics`."""
    rows = []
    for step, diff in enumerate(diffs, start=1):
        (row,) = parse_steps(STEP_LINE.replace("step:2", f"step:{step}").replace("1.2e-09", f"{diff}"), "1")
        rows.append(StepRow(row.step, row.run, {**row.metrics, **metrics}))
    return rows


def _synced(*steps: int, tensors: int = 27) -> str:
    """An hf run's log: per sync the server's update line, then the adapter's match line with the same digest."""
    lines = []
    for n, step in enumerate(steps, start=1):
        digest = f"{n:012x}"
        lines.append(
            SERVER + UPDATE_LINE.format(n=n, step=step, tensors=tensors, fingerprint=digest, note="")
        )
        lines.append(WORKER + sync_match_line(step, tensors, digest))
    return "\n".join(["noise", *lines, "more noise"])


def test_the_line_gives_every_figure_from_the_rows_and_the_logs():
    rows = _rows([1.4e-09, 7e-10, 1.6e-09])
    line = checks_line(rows, [_synced(0, 1, 2), _synced(2, 3)])
    assert line == (
        "checks: 5 syncs fingerprinted, all matched; sync max prob diff 1.6e-09 over 3 steps; 0 observation "
        "tokens in the loss (900 seen); 0 mask tokens outside the generated spans, 0 generated tokens unmasked, 0 "
        "trajectories unrecorded"
    )
    # the figures are read, not assumed: non-zero counts are summed over the steps and shown as they are
    counted = _rows([1e-9, 1e-9], **{"loss/mask_outside_generated": 3.0, "loss/unrecorded_trajectories": 1.0})
    assert (
        "6 mask tokens outside the generated spans, 0 generated tokens unmasked, 2 trajectories unrecorded"
        in (checks_line(counted, [_synced(0)]))
    )
    assert sync_matches([_synced(0, 1)]) == [(1, 27, "000000000001"), (2, 27, "000000000002")]
    assert checks_figures(f"table\n{line}\n") == {
        "syncs": 5.0,
        "diff": 1.6e-09,
        "covered": 3.0,
        "in_loss": 0.0,
        "seen": 900.0,
        "outside": 0.0,
        "missing": 0.0,
        "unrecorded": 0.0,
    }


def test_an_async_run_bounds_only_its_steps_without_stale_trajectories_and_says_how_many():
    rows = _rows([1e-9, 3e-5, 2e-9, 4e-5])
    rows = [StepRow(r.step, r.run, {**r.metrics, STALENESS_WORST_MAX: float(r.step % 2 == 0)}) for r in rows]
    line = checks_line(rows, [_synced(0, 1, 2, 3)], async_mode=True)
    assert "; sync max prob diff 2e-09 over 2 of 4 steps (staleness 0); " in line
    assert checks_figures(line)["steps"] == 4 and checks_figures(line)["covered"] == 2
    stale = [StepRow(r.step, r.run, {**r.metrics, STALENESS_WORST_MAX: 1.0}) for r in rows]
    with pytest.raises(StepCheckError, match=r"^checks: the sync bound covered no step: none of the 4 steps"):
        checks_line(stale, [_synced(0)], async_mode=True)


def test_a_bf16_run_reports_the_mean_its_watch_judged():
    rows = _rows([0.3, 0.4], **{PROB_DIFF_MEAN: 0.004})
    line = checks_line(rows, [_synced(0)], mean_bound=True)
    assert "; sync mean prob diff (bf16) up to 0.004 over 2 steps; " in line
    assert checks_figures(line)["diff"] == 0.004


@pytest.mark.parametrize(
    ("rows", "logs", "named"),
    [
        pytest.param([], [_synced(0)], "no training step was logged", id="no-step"),
        pytest.param(
            _rows([1e-9]),
            [_synced(0).replace("fingerprint matched", "fingerprint compared")],
            r"the weight-sync fingerprint check never ran",
            id="no-matched-sync",
        ),
        pytest.param(
            _rows([math.nan]),
            [_synced(0)],
            r"step 1: verl logged no training/rollout_probs_diff_max, so the weight sync is unchecked",
            id="no-prob-diff",
        ),
        pytest.param(
            [
                StepRow(
                    1,
                    "1",
                    {k: v for k, v in _rows([1e-9])[0].metrics.items() if k != "loss/observation_tokens"},
                )
            ],
            [_synced(0)],
            r"step 1: verl logged no loss/observation_tokens, so the loss mask is unchecked",
            id="no-observation-count",
        ),
        pytest.param(
            [StepRow(1, "1", {k: v for k, v in _rows([1e-9])[0].metrics.items() if "unrecorded" not in k})],
            [_synced(0)],
            r"verl logged no loss/unrecorded_trajectories, so the mask invariant is unchecked",
            id="no-invariant-count",
        ),
        pytest.param(
            _rows([1e-9], **{"loss/observation_tokens": 0.0}),
            [_synced(0)],
            r"saw no tool-response token although the run made 4 search calls",
            id="searched-but-saw-nothing",
        ),
    ],
)
def test_a_check_that_never_ran_fails_with_one_line_naming_it(rows, logs, named):
    with pytest.raises(SmokeCheckError, match=named) as info:
        checks_line(rows, logs, error=SmokeCheckError)
    assert str(info.value).startswith("checks: ") and "\n" not in str(info.value)


def test_a_run_that_never_searched_passes_without_observation_tokens():
    rows = _rows([1e-9], **{"search/calls": 0.0, "loss/observation_tokens": 0.0})
    assert "0 observation tokens in the loss (0 seen)" in checks_line(rows, [_synced(0)])


def test_every_hf_update_must_have_been_compared_by_the_trainer():
    assert hf_sync_problems([_synced(0, 1, 2), _synced(2, 3)]) == []
    # the server logged the update, but no adapter compared it (or its line never came): a sync went unchecked
    unchecked = "\n".join(
        line for line in _synced(0, 1).splitlines() if "000000000002" not in line or "hf-" in line
    )
    (problem,) = hf_sync_problems([_synced(0), unchecked])
    assert problem.startswith("invocation 2: the hf server logged 2 weight updates but the trainer matched 1")
    with pytest.raises(SmokeCheckError, match=r"^checks: invocation 2: the hf server logged 2"):
        run_checks_line(_rows([1e-9]), [_synced(0), unchecked])
    # verl's vLLM server prints no update line: its match lines alone count
    vllm_log = WORKER + sync_match_line(0, 9, "abc")
    assert run_checks_line(_rows([1e-9]), [vllm_log], hf=False).startswith("checks: 1 syncs fingerprinted")


# ---- the adapters print the line they are counted by --------------------------------------------------------


def test_the_hf_adapter_prints_a_match_line_with_the_servers_update_fingerprint(tmp_path, capsys):
    from searchrl.trainer.cpu.hf_rollout import HFGenerateServer
    from searchrl.trainer.cpu.tiny_model import write_tiny_model
    from tests.trainer.weight_sync.test_fingerprint import _adapter

    server = HFGenerateServer(
        str(write_tiny_model(tmp_path, ["hello world", "<tool_call>search</tool_call>"])),
        prompt_length=8,
        response_length=8,
    )
    adapter = _adapter(server)
    trained = {name: t.float() + 0.01 for name, t in server.model.state_dict().items()}
    for step in (0, 1):
        asyncio.run(adapter.update_weights(iter(trained.items()), global_steps=step))
    out = capsys.readouterr().out
    assert [(step, tensors) for step, tensors, _ in sync_matches([out])] == [
        (1, len(trained)),
        (2, len(trained)),
    ]
    assert hf_sync_problems([out]) == []  # the same digest as the server's update line


def test_the_vllm_tap_prints_a_match_line_per_checked_sync_and_none_for_a_failed_one(capsys):
    from tests.trainer.weight_sync.test_vllm_sync import _run

    _run(2, 3)
    matched = sync_matches([capsys.readouterr().out])
    assert [step for step, _, _ in matched] == [1, 2, 3] and len({digest for _, _, digest in matched}) == 3
    with pytest.raises(StepCheckError):
        _run(1, 3, stale_after=1)
    assert [step for step, _, _ in sync_matches([capsys.readouterr().out])] == [1]
    _run(1, 1, has_server=False)  # a rank without a server only sends: it checked nothing, it says nothing
    assert sync_matches([capsys.readouterr().out]) == []


def test_the_sglang_comparison_returns_the_digest_it_matched():
    from searchrl.trainer.weight_sync.sglang_sync import compare_blocks, leading_block

    sent = {"w": leading_block(torch.randn(6, 3), torch.bfloat16)}
    digest = compare_blocks({"w": sent["w"].tolist()}, sent, 0)
    assert len(digest) == 12 and digest == compare_blocks({"w": sent["w"].tolist()}, sent, 1)
