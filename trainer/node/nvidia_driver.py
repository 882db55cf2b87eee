"""The NVIDIA driver check, runnable before anything is installed: `python3 trainer/node/nvidia_driver.py --lock FILE`.

Why a file of its own, with nothing but the standard library: the check has to be the first line of `setup:` on
every node (sky/train.yaml). Before, it ran inside `searchrl train local`, i.e. after the multi-GB install, data
prep, Ray start and the health wait, and on the head node only, so a worker node with an old driver failed
minutes later inside Ray with a CUDA error. Run as a script it needs no venv:

    python3 trainer/node/nvidia_driver.py --lock requirements/gpu-vllm-py311.txt     # the CUDA pinned in the lock
    python3 trainer/node/nvidia_driver.py --torch                                    # the CUDA of the installed torch (images)

It prints one line and exits 0, or prints `error: ...` and exits 2. trainer/lockfiles.py re-exports these functions
for `searchrl train local`, turning DriverError into ConfigError.

A CUDA build needs a driver at least as new as the one its toolkit shipped with (NVIDIA's CUDA Toolkit release
notes, table "CUDA Toolkit and Corresponding Driver Versions"). The one way around it is NVIDIA's CUDA forward
compatibility package (`cuda-compat-<major>-<minor>`, data-center GPUs such as the H100 only), which ships a newer
user-mode driver: the error says so rather than refusing without a way out.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# Linux driver shipped with each CUDA toolkit release (major, minor) -> minimum driver version.
MIN_DRIVER: dict[tuple[int, int], str] = {
    (12, 1): "530.30.02",
    (12, 4): "550.54.14",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


class DriverError(Exception):
    """The node's driver cannot run the CUDA build (or cannot be read); the message is one line."""


def pins(lock_text: str) -> dict[str, str]:
    """name -> version for every `name==version` line of a compiled requirements file (names normalised)."""
    return {re.sub(r"[-_.]+", "-", m[1]).lower(): m[2] for m in _PIN.finditer(lock_text)}


def locked_cuda(lock_file: Path) -> tuple[int, int]:
    """(major, minor) of the CUDA runtime pinned in a lock (`nvidia-cuda-runtime[-cu12]==13.0.96` -> (13, 0))."""
    locked = pins(lock_file.read_text())
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if name in locked:
            major, minor = locked[name].split(".")[:2]
            return int(major), int(minor)
    raise DriverError(f"{lock_file} pins no nvidia-cuda-runtime: not a GPU lock (regenerate with make lock)")


def min_driver_for(cuda: tuple[int, int]) -> str:
    """The oldest Linux driver the CUDA toolkit release `cuda` supports."""
    known = sorted(k for k in MIN_DRIVER if k <= cuda)
    if not known or known[-1][0] != cuda[0]:
        raise DriverError(f"no known minimum driver for CUDA {cuda[0]}.{cuda[1]}: add it to MIN_DRIVER")
    return MIN_DRIVER[known[-1]]


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def driver_version(nvidia_smi: str = "nvidia-smi") -> str:
    """The driver version of the first GPU, from `nvidia-smi --query-gpu=driver_version --format=csv,noheader`."""
    try:
        proc = subprocess.run(
            [nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError:
        raise DriverError(
            "nvidia-smi not found: this node has no NVIDIA driver; training needs NVIDIA GPUs"
        ) from None
    except subprocess.TimeoutExpired:
        raise DriverError(
            "nvidia-smi did not answer in 30 s: the NVIDIA driver is hung; reboot the node"
        ) from None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines or not version_tuple(lines[0]):
        detail = " ".join((proc.stderr or proc.stdout).split())[:200]
        raise DriverError(
            f"nvidia-smi failed (exit {proc.returncode}): {detail or 'no driver version printed'}"
        )
    return lines[0]


def check_driver_for(cuda: tuple[int, int], source: str, *, nvidia_smi: str = "nvidia-smi") -> str:
    """Raise DriverError unless the driver is new enough for CUDA `cuda` (which `source` names); return it."""
    need = min_driver_for(cuda)
    have = driver_version(nvidia_smi)
    if version_tuple(have) < version_tuple(need):
        raise DriverError(
            f"NVIDIA driver {have} is too old for CUDA {cuda[0]}.{cuda[1]} {source} (needs >= {need}): "
            "upgrade the driver, pick a cloud image with a newer one, or on data-center GPUs install NVIDIA's "
            f"cuda-compat-{cuda[0]}-{cuda[1]} package and put its compat/ folder on LD_LIBRARY_PATH"
        )
    return have


def installed_cuda() -> tuple[int, int] | None:
    """The CUDA version the installed torch was built for (None: CPU build or no torch)."""
    try:
        import torch
    except ImportError:
        return None
    version = getattr(torch.version, "cuda", None)
    if not version:
        return None
    major, minor = str(version).split(".")[:2]
    return int(major), int(minor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Is this node's NVIDIA driver new enough for the CUDA build?"
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--lock", type=Path, help="a GPU lock (requirements/gpu-*-py3*.txt): its pinned CUDA")
    which.add_argument("--torch", action="store_true", help="the CUDA of the installed torch (a GPU image)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.lock is not None:
            if not args.lock.is_file():
                raise DriverError(f"{args.lock} does not exist: run `make lock` or check ROLLOUT")
            cuda, source = locked_cuda(args.lock), f"in {args.lock.name}"
        else:
            found = installed_cuda()
            if found is None:
                raise DriverError(
                    "the installed torch is not a CUDA build (or there is no torch): no GPU stack"
                )
            cuda, source = found, "of the installed torch"
        have = check_driver_for(cuda, source, nvidia_smi=args.nvidia_smi)
    except DriverError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    print(f"NVIDIA driver {have} is new enough for CUDA {cuda[0]}.{cuda[1]} {source}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
