"""Every link in the docs reaches what it names (issue 47 item 5: the CPU proofs moved to their own page, the two
image folders became one).

Read from README.md, every tracked `*.md` under docs/, sky/ and trainer/: each relative markdown link or image
must name a file that exists, each `#anchor` a heading of the file it points into (GitHub's slugs), and every
image lives in docs/images/, the one images folder. A section named in prose anywhere in the repository,
`docs/training.md "Trainer modes"`, must begin a heading of that page.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

PAGES = sorted(
    {
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "sky").glob("*.md"),
        *(REPO / "trainer").rglob("*.md"),
    }
)
IMAGES = REPO / "docs" / "images"
# [text](target) and ![alt](target); the text may hold backticks and brackets of its own, not a newline
LINK = re.compile(r"(!?)\[(?:[^\[\]\n]|\[[^\[\]\n]*\])*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6} (.+?)\s*#*$", re.M)
# a page name, an optional comma, then the start of one of its headings in double quotes
SECTION_REF = re.compile(r"(?<![\w/.-])(?:docs/)?([a-z][\w-]*\.md),? \"([^\"\n]{3,80})\"")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def links(page: Path) -> list[tuple[int, bool, str]]:
    """(line, is an image, target) of every link outside code fences."""
    text = page.read_text(encoding="utf-8")
    fenced = [m.span() for m in FENCE.finditer(text)]
    out = []
    for m in LINK.finditer(text):
        if any(a <= m.start() < b for a, b in fenced):
            continue
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1) == "!", m.group(2)))
    return out


def problems(page: Path) -> list[str]:
    found = []
    for line, image, target in links(page):
        where = f"{page.relative_to(REPO)}:{line}: {target}"
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            found.append(f"{where}: no such file")
            continue
        if image and file.parent != IMAGES.resolve():
            found.append(f"{where}: images live in docs/images/")
        if anchor and file.suffix == ".md" and anchor not in anchors(file):
            found.append(f"{where}: {file.relative_to(REPO)} has no heading #{anchor}")
    return found


def section_problems(path: str, text: str) -> list[str]:
    """Each `page.md "Heading"` in `text` whose page (under docs/, or at the top) has no heading starting so."""
    found = []
    for m in SECTION_REF.finditer(text):
        page = next((p for p in (REPO / "docs" / m.group(1), REPO / m.group(1)) if p.is_file()), None)
        if page is None:
            continue
        headings = HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
        if not any(h.startswith(m.group(2)) for h in headings):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f'{path}:{line}: {page.relative_to(REPO)} has no section "{m.group(2)}"')
    return found


def test_every_link_and_image_in_the_docs_resolves() -> None:
    assert [p for page in PAGES for p in problems(page)] == []


def test_every_section_named_in_the_repository_is_a_heading_of_its_page() -> None:
    """Code, YAML, Makefile and docs cite sections by name; a moved or renamed section leaves them pointing nowhere."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = []
    for path in tracked.split():
        file = REPO / path
        if file.suffix in {".png", ".parquet", ".gz"} or not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += section_problems(path, text)
    assert found == []


def test_one_images_folder() -> None:
    folders = sorted(p.name for p in (REPO / "docs").iterdir() if p.is_dir() and any(p.glob("*.png")))
    assert folders == ["images"]


def test_the_checker_sees_a_broken_link_a_stray_image_and_a_missing_anchor(
    tmp_path: Path, monkeypatch
) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## The `hf` engine: batches\n", encoding="utf-8")
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    page.write_text(
        "[ok](other.md#the-hf-engine-batches) [gone](missing.md) [no anchor](other.md#nowhere)\n"
        "![stray](pic.png) [web](https://example.com) [here](#a-section)\n\n## A section\n"
        "```\n[inside a fence](missing.md)\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert [p.split(": ", 1)[1] for p in problems(page)] == [
        "missing.md: no such file",
        "other.md#nowhere: other.md has no heading #nowhere",
        "pic.png: images live in docs/images/",
    ]
    code = 'see other.md "The `hf` engine" and docs/other.md, "Gone section"; not.md "Whatever"'
    assert section_problems("x.py", code) == ['x.py:1: other.md has no section "Gone section"']
