"""FLASH_ATTN has one reader, trainer/node/flash_switch.py (issue 47 item 4): the Makefile and sky/train*.yaml's setup
act on its printed answer, trainer/node/stack_check.py takes that answer as an argument, and TrainSettings calls
its function. Every accepted word means the same attention in each place, and every refused one is the same one
line and exit 2 in each place; before, the Makefile, the YAMLs and the stack check each parsed the variable and read
any word outside their off-list (`disable`) as on, which TrainSettings refused."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from searchrl.config import load_settings
from searchrl.errors import ConfigError
from searchrl.trainer.node.flash_switch import OFF, ON, flash_attn_on
from searchrl.trainer.settings import TrainSettings
from tests.conftest import REPO
from tests.test_sky_yaml import built_setup, run_setup

SWITCH = REPO / "trainer" / "node" / "flash_switch.py"
# Each accepted word once, in mixed cases (the test below checks that these are all of ON and OFF)
ACCEPTED = {
    "1": True, "TRUE": True, "t": True, "Yes": True, "y": True, "ON": True,
    "0": False, "false": False, "F": False, "NO": False, "n": False, "Off": False,
}  # fmt: skip
REFUSED = ["", " 1", "0 ", "2", "01", "1.0", "disable", "none", "tru"]
VALUES = [*ACCEPTED, *REFUSED]
FLASH_INSTALL = "uv pip install --no-deps --require-hashes -r requirements/gpu-flash-attn-py311.txt"


def _script(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FLASH_ATTN"}
    if value is not None:
        env["FLASH_ATTN"] = value
    return subprocess.run(
        [sys.executable, str(SWITCH)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _make_plan(value: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`make -n train-smoke` as a GPU machine plans it (nvidia-smi stubbed by `true`): what it would install.
    FLASH_ATTN comes from the environment (`FLASH_ATTN ?= 1` reads it as it is): on make's command line `FLASH_ATTN= 1`
    would lose its leading space to make's assignment syntax before any reader saw it."""
    env = {k: v for k, v in os.environ.items() if k != "FLASH_ATTN"}
    if value is not None:
        env["FLASH_ATTN"] = value
    return subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "-n", "train-smoke", "NVIDIA_SMI=true",
         f"GPU_VENV={tmp_path}/gpu", f"TOOLS_VENV={tmp_path}/tools"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_accepted_words_are_the_booleans_trainsettings_always_took() -> None:
    """ON and OFF are pydantic's boolean strings: nothing TrainSettings accepted before is refused now."""
    assert {word.lower() for word in ACCEPTED} == ON | OFF and not ON & OFF
    pydantic_bool = TypeAdapter(bool)
    for value, on in ACCEPTED.items():
        assert flash_attn_on(value) is on is pydantic_bool.validate_python(value)
    for value in REFUSED:
        with pytest.raises(ValueError, match="is not a switch"):
            flash_attn_on(value)
        with pytest.raises(ValidationError):
            pydantic_bool.validate_python(value)
    assert flash_attn_on(None) is True  # unset: flash-attn 2, the default everywhere


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.parametrize("value", [None, *VALUES], ids=lambda v: repr(v))
def test_the_script_trainsettings_and_the_makefile_agree(
    value: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, plan = _script(value), _make_plan(value, tmp_path)
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    monkeypatch.delenv("FLASH_ATTN", raising=False)
    if value is not None:
        monkeypatch.setenv("FLASH_ATTN", value)
    if value is None or value in ACCEPTED:
        on = value is None or ACCEPTED[value]
        assert (script.returncode, script.stdout, script.stderr) == (0, f"{int(on)}\n", "")
        assert load_settings(TrainSettings).flash_attn is on
        assert plan.returncode == 0, plan.stderr
        assert ("--no-deps --require-hashes -r requirements/gpu-flash-attn-py311.txt" in plan.stdout) is on
        assert f"/gpu/.lock-vllm-311{'-flash-attn' if on else ''}\n" in plan.stdout
        # train-local/train-smoke hand verl the answer, not the word
        assert f" FLASH_ATTN={int(on)} SMOKE=1 " in plan.stdout
        return
    said = f"FLASH_ATTN: {value!r} is not a switch: "
    assert script.returncode == 2 and script.stdout == ""
    assert script.stderr.splitlines() == [f"error: {said}1, true, yes, on (flash-attn 2) or 0, false, no, off "
                                          "(torch's sdpa), any case"]  # fmt: skip
    line = script.stderr.strip().removeprefix("error: ")
    with pytest.raises(ConfigError) as refused:
        load_settings(TrainSettings)
    assert str(refused.value) == line
    assert plan.returncode == 2 and plan.stdout == ""
    (make_line,) = plan.stderr.splitlines()
    assert re.fullmatch(rf"Makefile:\d+: \*\*\* error: {re.escape(line)}\.  Stop\.", make_line)


def test_the_yamls_act_on_the_scripts_answer_only(tmp_path: Path) -> None:
    """sky/train*.yaml read FLASH_ATTN nowhere but through the script (so they agree with it on every value), and
    their setup, as SkyPilot builds it, installs flash-attn for an on word, not for an off word, and stops before
    installing anything at a refused word with the script's one line and exit 2."""
    for name, values in {
        "train.yaml": ["TRUE", "Off", "disable"],
        "train-single.yaml": ["y", "0", ""],
    }.items():
        setup = built_setup(name, FLASH_ATTN="SENTINEL")["setup"]
        export = "export FLASH_ATTN=SENTINEL"  # what SkyPilot writes for --env FLASH_ATTN=... (shlex.quote)
        assert setup.count(export) == 1
        code = [line.split("#")[0] for line in setup.replace(export, "").splitlines()]
        assert [line.strip() for line in code if "FLASH_ATTN" in line or "flash_attn" in line] == [
            'flash_attn="$(python3 trainer/node/refusal.py --state "$refusals" -- python3 trainer/node/flash_switch.py)"',
            'if [[ "$flash_attn" == 1 ]]; then',
            *(
                ['python3 trainer/node/refusal.py --state "$refusals" -- python trainer/node/stack_check.py '
                 '--requires verl --flash-attn "$flash_attn"']
                if name == "train.yaml" else []
            ),
        ], name  # fmt: skip
        for value in values:
            home = tmp_path / f"{name}-{len(value)}-{value}"
            home.mkdir()
            run = setup.replace(export, f"export FLASH_ATTN={shlex.quote(value)}")
            rc, out, calls = run_setup(name, home, check=False, script=run)
            if value in ACCEPTED:
                assert rc == 0, out[-2000:]
                assert (FLASH_INSTALL in calls) is ACCEPTED[value], (name, value)
                continue
            assert rc == 2 and "uv " not in calls, (name, value, out[-2000:])
            assert f"error: FLASH_ATTN: {value!r} is not a switch" in out
