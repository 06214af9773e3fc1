"""Every relative link in the front page, the component READMEs, the runbooks and the results
page names a file that exists and, for a ``#fragment`` into a Markdown file, one of its headings
(GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, ``-1`` on a repeat) or an
explicit ``<a id="…">``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "operator/README.md",
    "runtime/README.md",
    "gateway/README.md",
    "charts/README.md",
    "charts/tidal/RUNBOOKS.md",
    "e2e/README.md",
    "bench/RESULTS.md",
    "CONTRIBUTING.md",
    "SECURITY.md",
    "CHANGELOG.md",
    "examples/README.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", FENCE.sub("", markdown), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found | set(re.findall(r'<a id="([^"]+)"', markdown))


def broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not checked here
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif (
            resolved.suffix == ".md" and fragment and fragment not in anchors(resolved.read_text())
        ):
            broken.append(f"{target}: no heading #{fragment}")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page: str) -> None:
    assert not broken_links(REPO / page), f"{page}:\n" + "\n".join(broken_links(REPO / page))


def test_anchors_follow_github() -> None:
    text = "# A title\n## Zero → first answer (issue 21 §2) — `x.py`\n## Faults\n## Faults\n"
    assert anchors(text) == {
        "a-title",
        "zero--first-answer-issue-21-2--xpy",
        "faults",
        "faults-1",
    }
