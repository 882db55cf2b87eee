"""Every commit the docs name is in this checkout's history (issue 39 item 9).

docs/training.md named a commit range `ee0a14f-78acdd5` whose second end was never in the history (a branch
rebased away), so a reader could not check what the figures came from. A doc names a commit by git's 7-character
abbreviation; each such word (hex, with a letter and a digit, alone: not part of a longer hash or checksum) of
README.md, docs/**/*.md and sky/README.md must be an ancestor of HEAD, or be listed below as another project's.

It needs the history: without git, outside a work tree of its own (an unpacked sdist) or in a shallow clone (GitHub's
default checkout) it skips and says why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "sky" / "README.md"]
# 7 hex characters standing alone: longer hashes (index checksums, weight fingerprints) are not commits
SHORT_SHA = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7}(?![0-9A-Za-z_])")
# commits of other repositories the docs cite, with where they are from
FOREIGN = {"a14dc3a": "PeterJinGo/Search-R1 (the prompt text of its released checkpoints)"}


def shas_in(text: str) -> list[str]:
    """The 7-character hex words of `text` with a letter and a digit (numbers and plain words are not commits)."""
    return [s for s in SHORT_SHA.findall(text) if re.search(r"[a-f]", s) and re.search(r"\d", s)]


def named_commits(paths: list[Path]) -> dict[str, list[str]]:
    """Each commit the files name -> where (path:line)."""
    found: dict[str, list[str]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for sha in shas_in(line):
                found.setdefault(sha, []).append(f"{path.relative_to(REPO)}:{number}")
    return found


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)


def _history_or_skip() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the docs' commits cannot be looked up")
    top = _git("rev-parse", "--show-toplevel").stdout.strip()
    if (
        not top or Path(top).resolve() != REPO.resolve()
    ):  # no .git, or the tree sits inside another repository
        pytest.skip(
            f"{REPO} is not a git work tree of its own (no .git): the docs' commits cannot be looked up"
        )
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone lacks the history the docs name (clone in full, or fetch-depth: 0)")


def test_every_commit_the_docs_name_is_in_the_history() -> None:
    _history_or_skip()
    named = named_commits(DOCS)
    missing = [
        f"{sha} ({', '.join(where)})"
        for sha, where in sorted(named.items())
        if sha not in FOREIGN and _git("merge-base", "--is-ancestor", sha, "HEAD").returncode != 0
    ]
    assert not missing, f"commits the docs name that are not ancestors of HEAD: {'; '.join(missing)}"
    # the list of other projects' commits keeps up with the docs
    assert set(FOREIGN) <= set(named), f"FOREIGN lists commits no doc names: {set(FOREIGN) - set(named)}"


def test_the_scan_finds_commits_and_leaves_checksums_fingerprints_and_numbers() -> None:
    text = (
        "commits ee0a14f-78acdd5, at 7faff59; index wiki-bundled-en-0bad2eff6d, fingerprint a9a0ffb49ae5, "
        "date 20261123, word defaced, sha256:cf3de5a0b1, (db26c79)"
    )
    assert shas_in(text) == ["ee0a14f", "78acdd5", "7faff59", "db26c79"]
