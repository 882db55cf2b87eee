"""A sabotage switch reaches only the run that asks for it, and a run with one says so (issue 53 item 5).

`SEARCHRL_TEST_SABOTAGE` left in a shell (after trying `make learn-cpu` by hand, say) once reached the healthy
`make train-cpu` run of `make test`: the session fixture that starts it ran before the autouse `clean_env` and handed
it the whole environment, and the run failed at step 1 with the observations_in_loss sabotage's figures. Each run a
test starts now gets `clean_environ()` (tests/conftest.py) plus its own variables, and a sabotaged run names its
sabotage in its first line and in its error line (searchrl/cli/train_cpu.py, trainer/cpu/sabotage.py).
"""

from __future__ import annotations

import pytest

from searchrl.cli import main
from searchrl.trainer.cpu import sabotage
from tests.trainer.e2e.runs import CliRuns

# a `searchrl train cpu` that stops at its flag check, before anything starts: a second or two of start-up
REFUSED = ["train", "cpu", "gate", "--rollout", "vllm", "--model", "smollm2-135m"]
REFUSAL = "error: --rollout vllm runs the tiny-model loops only (smoke, learn), not `gate`"


def _left_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a session fixture sees when the developer's shell carries these: it starts before clean_env."""
    monkeypatch.setenv(sabotage.ENV, sabotage.OBSERVATIONS_IN_LOSS)
    monkeypatch.setenv("SEARCHRL_DEBUG", "1")  # main() would print a traceback under the error line


def test_a_cli_run_gets_the_clean_environment_plus_only_its_own_variables(tmp_path, monkeypatch):
    _left_in_the_shell(monkeypatch)
    runs = CliRuns(tmp_path)
    runs.start("plain", REFUSED)
    runs.start("debug", REFUSED, {"SEARCHRL_DEBUG": "1"})
    plain, debug = runs.result("plain", 120), runs.result("debug", 120)
    # neither the sabotage (it would be announced, and named in the error) nor SEARCHRL_DEBUG reached it
    assert plain.returncode == 2 and plain.stderr.strip().splitlines() == [REFUSAL], plain.stderr
    # what the run asked for did
    assert debug.returncode == 2 and "Traceback" in debug.stderr and REFUSAL in debug.stderr, debug.stderr
    assert "SABOTAGE" not in debug.stderr


def test_the_learning_runs_get_the_clean_environment_and_their_own_sabotage(monkeypatch):
    from tests.trainer.e2e.test_learn_cpu import _learn_args

    _left_in_the_shell(monkeypatch)
    _, honest = _learn_args(None, "sync")
    assert sabotage.ENV not in honest and "SEARCHRL_DEBUG" not in honest and "PATH" in honest
    _, stale = _learn_args(sabotage.STALE_SYNC, "sync")
    assert stale[sabotage.ENV] == sabotage.STALE_SYNC and "SEARCHRL_DEBUG" not in stale


def _stub_run(monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    import searchrl.trainer.proofs.train_cpu

    def fail(out, **kwargs):
        raise failure

    monkeypatch.setattr(searchrl.trainer.proofs.train_cpu, "run_cpu_smoke", fail)


def test_a_sabotaged_run_says_so_first_and_in_its_error_line(capsys, monkeypatch):
    from searchrl.errors import SmokeCheckError

    monkeypatch.setenv(sabotage.ENV, sabotage.OBSERVATIONS_IN_LOSS)
    failure = SmokeCheckError("1: step 1: observation tokens in loss 806; verl stopped at step 1")
    _stub_run(monkeypatch, failure)
    assert main(["train", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "SABOTAGE observations_in_loss is switched on (SEARCHRL_TEST_SABOTAGE=observations_in_loss): this run is "
        "meant to fail; unset SEARCHRL_TEST_SABOTAGE for a real run"
    )
    assert err[1:] == [
        "error: SABOTAGE observations_in_loss was switched on (SEARCHRL_TEST_SABOTAGE): 1: step 1: observation "
        "tokens in loss 806; verl stopped at step 1"
    ]


def test_a_sabotaged_runs_bug_names_the_sabotage_under_its_traceback(capsys, monkeypatch):
    monkeypatch.setenv(sabotage.ENV, sabotage.STALE_SYNC)
    _stub_run(monkeypatch, RuntimeError("a bug, not a refusal"))
    with pytest.raises(RuntimeError) as caught:
        main(["train", "cpu"])
    assert caught.value.__notes__ == ["SABOTAGE stale_sync was switched on (SEARCHRL_TEST_SABOTAGE)"]
    assert capsys.readouterr().err.startswith("SABOTAGE stale_sync is switched on")


def test_a_healthy_run_says_nothing_of_sabotage(capsys, monkeypatch):
    from searchrl.errors import SmokeCheckError

    _stub_run(monkeypatch, SmokeCheckError("1: verl exited 1: RuntimeError: boom"))
    assert main(["train", "cpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: 1: verl exited 1: RuntimeError: boom"]


def test_an_unknown_sabotage_stops_the_run_before_it_starts(capsys, monkeypatch):
    monkeypatch.setenv(sabotage.ENV, "observations-in-loss")
    _stub_run(monkeypatch, AssertionError("the run started"))
    assert main(["train", "cpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: SEARCHRL_TEST_SABOTAGE='observations-in-loss' is not one of " + ", ".join(sabotage.NAMES)
    ]
