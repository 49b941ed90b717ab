"""The docs hold together: every relative link in the README and the other Markdown files of the
repo points at a file that exists (and at a heading that exists, where it names one), and no doc
or test sends a reader to a file outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def markdown_files() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [p for p in (ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md")
            if p.exists()] + docs


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside its fenced code blocks."""
    return LINK.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} +(.+)$", FENCE.sub("", path.read_text()),
                                        re.M)}


def broken(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of the Markdown file at path."""
    out = []
    for target in links(path.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not this test's to fetch
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif not dest.is_relative_to(root):
            out.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {dest.name}")
    return out


def test_the_link_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "A.md").write_text("# Top\n## Hangs, and what to do\n")
    doc = tmp_path / "B.md"
    doc.write_text("[ok](A.md) [sec](A.md#hangs-and-what-to-do) [web](https://x.org/y)\n"
                   "[gone](C.md) [bad](A.md#nowhere)\n```\n[code](D.md)\n```\n")
    assert broken(doc, tmp_path) == ["C.md: no such file",
                                     "A.md#nowhere: no heading #nowhere in A.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_in_the_repo(path: Path) -> None:
    assert broken(path) == []


def test_the_readme_is_a_landing_page() -> None:
    """At most 300 lines; the manual is in docs/. It opens with what fleet is, then the install."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Install on your laptop", headings


def test_nothing_in_the_repo_cites_a_file_outside_it() -> None:
    """The team's notes live outside the repository (a `shared/` folder): a reader of the repo
    cannot follow a pointer there, nor to an issue number that means nothing in it. (The
    benchmarks' record and the changelog name the work they measured or list, by date.)"""
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", "*.md", "tests", "fleet",
                              ":!docs/BENCHMARKS.md", ":!CHANGELOG.md"],
                             capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for rel in tracked:
        if rel == "tests/unit/test_docs.py" or not rel.endswith((".py", ".md", ".sh")):
            continue
        for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1):
            if re.search(r"shared/[A-Z]+\.md|\b[Ii]ssue #?\d+", line):
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert bad == []


def test_ci_runs_the_readme_test_command() -> None:
    """`.ci/run` is exactly the README's command that installs everything and passes the tests."""
    readme = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()
              if ln.strip().startswith(".ci/setup") and "pytest" in ln]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.strip().startswith(".ci/setup")]
    assert len(readme) == 1 and ci == readme, (readme, ci)
