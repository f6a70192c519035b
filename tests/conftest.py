"""Fixtures shared by the whole suite.

The tree mirrors the packages: ``tests/<package>/`` holds the tests of one package (some start
real processes), ``tests/e2e/`` the end-to-end tests (a real server through the CLI or the
embedded ``Launcher``, every one marked ``e2e``), ``tests/project/`` the checks of the tree as a
whole (layering, docs, install script), and ``tests/support/`` the one support package.

Every test runs with the product's environment variables cleared, and every process a test leaves
behind (its whole tree, found with psutil) is killed when the test ends, pass or fail; a test that
leaves one behind fails, so a leak is a bug report, not a silent cleanup.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The test processes, and every process they start unless a test says otherwise, run OpenMP's
# threads passive (asleep while they wait, as a launch runs its schedulers): the suite runs more
# processes than there are cores, where a thread spinning at a barrier takes a core from the
# process that has work (the in-process engine tests ran 3x slower beside two busy cores).
# Their launches' schedulers spin a tenth of a launch's default before they sleep
# (``GOMP_SPINCOUNT``, launcher/supervisor/plan.py): beside other busy processes a spinning thread
# only burns the core another one waits for (the whole suite: 674 s -> 620 s, one run each).
# Set before anything loads torch's OpenMP runtime, which reads it once; the user's value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from support import PRODUCT_ENV, descendants, kill_tree  # noqa: E402

# demo_site: the demo plugin, pip-installed once; fresh_process: a test of the process-wide state
# (platform selection, plugins, hooks) in this process.
pytest_plugins = ("support.plugins", "support.process")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the suite's default): one test process per core, plus one. A test mostly
    waits on the processes it started (a worker's start-up, a restart's backoff, a grace period),
    so a process per core leaves the cores idle about half the time; one more fills that."""
    return min((os.cpu_count() or 1) + 1, 8)


def pytest_collection_modifyitems(items):
    """Every test under ``tests/e2e/`` is end-to-end (``-m "not e2e"`` leaves them out)."""
    for item in items:
        if E2E in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _product_env(monkeypatch):
    for name in PRODUCT_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_orphans(request):
    before = {p.pid for p in descendants()}
    yield
    left = [p for p in descendants() if p.pid not in before]
    # multiprocessing's resource tracker and forkserver are shared helpers, not test leaks.
    left = [p for p in left if not _is_mp_helper(p)]
    if left:
        names = ", ".join(f"{p.pid}:{_cmd(p)}" for p in left)
        kill_tree(left)
        if not getattr(request.node, "_leak_ok", False):
            pytest.fail(f"test left processes running (now killed): {names}")


def _cmd(p) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except Exception:  # noqa: BLE001 - the process may be gone already
        return "?"


def _is_mp_helper(p) -> bool:
    cmd = _cmd(p)
    return "resource_tracker" in cmd or "forkserver" in cmd


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """An empty folder to hold real dist-info distributions (see ``support.make_dist``)."""
    path = tmp_path / "site"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> Path:
    """A tiny diffusers text-to-image pipeline saved on disk once per session
    (``support.diffusion.build_tiny_pipeline``); default size 32x32."""
    from support.diffusion import build_tiny_pipeline

    return build_tiny_pipeline(tmp_path_factory.mktemp("diffusion") / "tiny-sd")


@pytest.fixture(scope="session")
def tiny_dit_pipeline(tmp_path_factory) -> Path:
    """A tiny diffusers DiT pipeline (SD3 layout, RMSNorm in its attention) saved once per session."""
    from support.diffusion import build_tiny_dit_pipeline

    return build_tiny_dit_pipeline(tmp_path_factory.mktemp("diffusion-dit") / "tiny-sd3")
