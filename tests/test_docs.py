"""The documentation stays inside the repository: every Markdown link in the README, docs/,
benchmarks/README.md and the examples' READMEs names a file of this repository, and the README
stays a front door (under 15 KB)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

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
    problems = [
        p for t in links(document.read_text(encoding="utf-8")) if (p := problem(document, t))
    ]
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


def test_the_readme_is_a_front_door() -> None:
    size = (REPO / "README.md").stat().st_size
    assert size < 15 * 1024, f"README.md is {size} bytes; move details into docs/ and link them"
