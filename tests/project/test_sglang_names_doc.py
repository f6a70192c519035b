"""docs/plugins.md's tables of SGLang's names say what ``launchspec.compat`` aliases."""

from __future__ import annotations

import re

from support import REPO

from launchspec import compat

DOC = REPO / "docs" / "plugins.md"


def _rows(title_start: str) -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8").split("## Plugins written for SGLang", 1)[1]
    table = text.split(title_start, 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _first_code(cell: str) -> str:
    return re.findall(r"`([^`]+)`", cell)[0]


def test_the_module_table_is_the_aliased_one():
    documented = {_first_code(a): _first_code(b) for a, b in _rows("| SGLang module")}
    assert documented == compat.MODULES


def test_every_renamed_or_absent_target_is_documented():
    rows = _rows("| SGLang hook target")
    documented = {_first_code(a): b for a, b in rows}
    for sglang, ours in compat.NAMES.items():
        # The row of the name itself, or of a target under it (a renamed class's method).
        key, row = next((k, v) for k, v in documented.items() if k.startswith(sglang))
        assert _first_code(row) == ours + key[len(sglang) :], (sglang, row)
    for sglang, nearest in compat.ABSENT.items():
        assert documented[sglang].startswith("none"), sglang
        assert nearest.rpartition(".")[2] in documented[sglang]


def test_every_documented_hook_target_is_a_known_one():
    """The nearest-target candidates are the targets the docs' tables list."""
    tables = [
        (REPO / "docs" / "plugins.md", "### Common hook targets"),
        (REPO / "docs" / "diffusion.md", "### Common hook targets for diffusion"),
    ]
    documented = set()
    for path, heading in tables:
        section = path.read_text(encoding="utf-8").split(heading, 1)[1].split("\n#", 1)[0]
        for line in section.splitlines():
            if line.startswith("| "):  # a row names SGLang's target and this project's
                documented.update(re.findall(r"`([^`]+)`", line))
    assert set(compat.TARGETS) <= documented
