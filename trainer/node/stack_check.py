"""What the GPU venv holds, checked on every node in setup before the long part: `python trainer/node/stack_check.py`.

    python trainer/node/stack_check.py --requires verl   # verl's declared version ranges against what is installed
    python trainer/node/stack_check.py --flash-attn 1    # flash-attn 2 itself; 0: sdpa, nothing to check

It prints one line and exits 0, or prints `error: ...` and exits 2 (so trainer/node/refusal.py counts a repeat). Run with
the venv's python, after the install and before data prep (sky/train.yaml); `searchrl train local` runs the
flash-attn check again at launch (trainer/launch.py check_stack), on every stack.

Why each check exists:
- `--requires verl`: GPU_STACK=image installs `verl==0.9.1 --no-deps` over verl's image, so nothing resolves verl's
  own requirements against the image's packages. verl 0.9.1 declares `transformers>=5.5.3,!=5.6.0,<5.11`;
  verlai/verl:sgl0512.dev4 carries transformers 5.3.0 (issue 38), which would otherwise fail inside Ray, after data
  prep and Ray start on every node. The ranges are read from verl's installed metadata
  (importlib.metadata.requires), never copied here, so a new verl brings its own.
- `--flash-attn 1|0`: verl's FSDP engine asks transformers for `flash_attention_2`, which needs flash-attn 2's CUDA
  extension `flash_attn_2_cuda` and its `flash_attn.flash_attn_varlen_func` (the packed micro batches). An
  importable `flash_attn` proves neither: flash-attn-4 (in the sglang lock, 4.0.0b15) ships only `flash_attn/cute/`,
  which makes `flash_attn` an importable namespace package without FA2's kernels. The value is FLASH_ATTN as
  trainer/node/flash_switch.py reads it (sky/train.yaml passes its answer), never parsed here: one reader.

Standard library only, except `packaging` for version ranges (a dependency of verl; else pip's vendored copy).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

FA2_EXTENSION = "flash_attn_2_cuda"  # flash-attn 2's compiled CUDA kernels (a top-level module of its wheel)
FA2_VARLEN = "flash_attn_varlen_func"  # what packed (unpadded) attention calls
WAY_OUT = "or set FLASH_ATTN=0 (torch's sdpa, padded micro batches)"


class StackError(Exception):
    """The venv cannot run the trainer as configured; the message is one line."""


def check_flash_attn_2() -> str:
    """Raise StackError unless flash-attn 2 itself is importable (its CUDA extension and varlen function).

    Returns its version. torch is imported first: the extension links against libtorch.
    """
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise StackError(f"torch is not importable ({exc}): flash-attn needs the GPU lock's torch") from None
    try:
        package = importlib.import_module("flash_attn")
    except ImportError as exc:
        raise StackError(
            f"FLASH_ATTN=1 but flash-attn is not installed ({exc}): install "
            f"requirements/gpu-flash-attn-py3{sys.version_info.minor}.txt with --no-deps --require-hashes, {WAY_OUT}"
        ) from None
    try:
        importlib.import_module(FA2_EXTENSION)
    except ImportError as exc:
        where = ", ".join(getattr(package, "__path__", []) or [str(getattr(package, "__file__", "?"))])
        raise StackError(
            f"flash_attn at {where} has no flash-attn 2 CUDA extension ({FA2_EXTENSION}: {exc}); flash-attn-4's "
            f"flash_attn/cute or a build for another torch is not FA2: install requirements/gpu-flash-attn-py3"
            f"{sys.version_info.minor}.txt, {WAY_OUT}"
        ) from None
    if not callable(getattr(package, FA2_VARLEN, None)):
        raise StackError(
            f"flash_attn has its CUDA extension but no {FA2_VARLEN} (packed micro batches need it): not flash-attn "
            f"2.x; install requirements/gpu-flash-attn-py3{sys.version_info.minor}.txt, {WAY_OUT}"
        )
    try:
        return importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(package, "__version__", "unknown"))


def unmet_requirements(package: str) -> list[str]:
    """`name version (needs spec)` for every versioned, unconditional requirement of `package` that the
    installed packages miss or fall outside. Requirements under an extra, or without a version range, are
    not checked (verl lists optional loggers and tools there)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's vendored copy: `uv venv --seed` puts pip in every venv
        try:
            # the same class, vendored: mypy reads pip's copy as a distinct type
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
        except ImportError:
            raise StackError(
                "neither packaging nor pip is importable here: cannot read version ranges"
            ) from None
    try:
        declared = importlib.metadata.requires(package) or []
    except importlib.metadata.PackageNotFoundError:
        raise StackError(f"{package} is not installed in this venv: nothing to check it against") from None
    unmet = []
    for line in declared:
        req = Requirement(line)
        if not req.specifier or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{req.name} missing (needs {req.specifier})")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req.name} {have} (needs {req.specifier})")
    return unmet


def check_requires(package: str) -> str:
    """Raise StackError naming every unmet versioned requirement of `package`; return its version."""
    unmet = unmet_requirements(package)
    version = importlib.metadata.version(package)
    if unmet:
        raise StackError(
            f"{package} {version} needs what this environment does not have: {'; '.join(unmet)}. With "
            "GPU_STACK=image pick an image that satisfies it, or use GPU_STACK=lock (requirements/, resolved for it)"
        )
    return version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Does this venv hold what the trainer needs?")
    parser.add_argument("--requires", metavar="PACKAGE", help="check PACKAGE's declared version ranges")
    parser.add_argument(
        "--flash-attn",
        choices=("1", "0"),
        help="1: check flash-attn 2; 0: sdpa, nothing to check (FLASH_ATTN as trainer/node/flash_switch.py reads it)",
    )
    args = parser.parse_args(argv)
    if not args.requires and not args.flash_attn:
        parser.error("name --requires PACKAGE and/or --flash-attn 1|0")
    said = []
    try:
        if args.requires:
            said.append(f"{args.requires} {check_requires(args.requires)}: its version ranges are met")
        if args.flash_attn:
            if args.flash_attn == "1":
                said.append(f"flash-attn {check_flash_attn_2()} with its FA2 CUDA extension")
            else:
                said.append("FLASH_ATTN=0: sdpa, flash-attn not needed")
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    print("; ".join(said))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
