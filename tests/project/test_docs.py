"""The documentation stays inside the repository: every Markdown link in the README, docs/,
benchmarks/README.md and the examples' READMEs names a file of this repository (and an anchor,
when it has one, names a heading of that file), and the README stays a front door (under 15 KB)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# [text](target) and [text](target "title"); images too. Fenced code blocks are left out first.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def documents() -> list[Path]:
    """Every Markdown file this test holds to the rule."""
    found = [REPO / "README.md", REPO / "benchmarks" / "README.md"]
    found += sorted((REPO / "docs").glob("*.md"))
    found += sorted((REPO / "examples").glob("**/README.md"))
    return [path for path in found if path.is_file()]


def links(text: str) -> list[str]:
    """The targets of the Markdown links in ``text``, outside code."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    return LINK.findall(text)


def problem(document: Path, target: str) -> str | None:
    """Why ``target``, linked from ``document``, does not resolve inside the repository; None if it does."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return f"{target!r} leaves the repository (an absolute URL); link a file of the repository"
    path = target.split("#", 1)[0]
    if not path:
        return None  # an anchor in the same document
    if path.startswith("/"):
        return f"{target!r} is an absolute path; use a path relative to {document.name}"
    resolved = (document.parent / path).resolve()
    if not resolved.is_relative_to(REPO):
        return f"{target!r} resolves outside the repository ({resolved})"
    if not resolved.exists():
        return f"{target!r} names no file of the repository ({resolved.relative_to(REPO)})"
    return None


def anchors(text: str) -> set[str]:
    """The anchors a Markdown renderer gives the headings of ``text``: lower case, punctuation
    dropped, spaces as hyphens, a repeated one numbered (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def missing_anchor(document: Path, target: str) -> str | None:
    """Why the ``#anchor`` of ``target`` names no heading of the Markdown file it points to;
    None when it does, or when there is no anchor to check."""
    path, _, anchor = target.partition("#")
    if not anchor or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None
    linked = (document.parent / path).resolve() if path else document
    if linked.suffix != ".md" or not linked.is_file():
        return None
    if anchor not in anchors(linked.read_text(encoding="utf-8")):
        return f"{target!r}: {linked.relative_to(REPO)} has no heading with the anchor #{anchor}"
    return None


def test_the_documents_are_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in documents()}
    assert {
        "README.md",
        "docs/plugins.md",
        "docs/check-platform.md",
        "docs/internals.md",
        "benchmarks/README.md",
    } <= names


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_resolves_inside_the_repository(document: Path) -> None:
    targets = links(document.read_text(encoding="utf-8"))
    problems = [p for t in targets if (p := problem(document, t) or missing_anchor(document, t))]
    assert not problems, f"{document.relative_to(REPO)}: " + "; ".join(problems)


def test_the_checker_refuses_links_that_leave_the_repository() -> None:
    readme = REPO / "README.md"
    assert links("see [the spec](../shared/spec.mdx) and `[not](a-link)`") == ["../shared/spec.mdx"]
    assert "outside the repository" in problem(readme, "../shared/spec.mdx")
    assert "absolute URL" in problem(readme, "https://example.com/x")
    assert "absolute path" in problem(readme, "/etc/passwd")
    assert "names no file" in problem(readme, "docs/no-such-page.md")
    assert problem(readme, "docs/plugins.md#writing-a-plugin") is None
    assert problem(readme, "#running-a-server") is None
    assert missing_anchor(readme, "#running-a-server") is None
    assert "no heading with the anchor #no-such-section" in missing_anchor(
        readme, "#no-such-section"
    )
    assert missing_anchor(readme, "docs/plugins.md#writing-a-plugin") is None
    assert anchors("# A `b` (c: d)\n## A `b` (c: d)\n```\n# not a heading\n```") == {
        "a-b-c-d",
        "a-b-c-d-1",
    }


def test_the_readme_is_a_front_door() -> None:
    size = (REPO / "README.md").stat().st_size
    assert size < 15 * 1024, f"README.md is {size} bytes; move details into docs/ and link them"
