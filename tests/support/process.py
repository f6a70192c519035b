"""The ``fresh_process`` fixture: a test of the process-wide state that runs in the test process.

The platform selection of both runtimes, the hook registries and the plugin phases are chosen
once per process; ``hooks.testing.fresh_plugins`` (which includes
``platforms.testing.fresh_platforms``) makes them fresh for a block and restores them after it.
The fixture runs the whole test in that block, with the test's ``site`` folder on ``sys.path``,
so the real distributions ``support.make_dist`` writes there are found as installed ones. When
the test ends, every hook target is restored, nothing is selected, and every module imported from
a folder the test put on ``sys.path`` (``site``, or another it added, such as ``demo_site``) is
forgotten, so the next test imports its own copy (module names like ``tgt`` repeat across tests).

conftest.py registers this module as a pytest plugin. Tests whose subject *is* a fresh process
(spawn safety, import neutrality, the first resolution in a process, fork, threads racing the
first call, a command's exit status) run one with ``support.run_python`` instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.testing import fresh_plugins


@pytest.fixture
def fresh_process(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test runs as a process that has selected no platform and loaded no plugin, with
    ``site`` on ``sys.path`` (see the module docstring)."""
    paths_before = set(sys.path)
    modules_before = set(sys.modules)
    monkeypatch.syspath_prepend(str(site))
    try:
        with fresh_plugins():
            yield
    finally:
        added = [Path(p) for p in sys.path if p not in paths_before]
        forget_modules_from(added, keep=modules_before)


def forget_modules_from(
    folders: list[Path], keep: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """Drop from ``sys.modules`` every module loaded from a file under ``folders`` (except the
    names in ``keep``); returns the names dropped."""
    roots = [folder.resolve() for folder in folders]
    dropped = []
    for name, module in list(sys.modules.items()):
        if name in keep:
            continue
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if any(root == path or root in path.parents for root in roots):
            del sys.modules[name]
            dropped.append(name)
    return dropped
