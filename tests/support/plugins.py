"""Plugin fixtures for platform (and hook) tests: the demo package installed by real pip, once.

conftest.py registers this module as a pytest plugin, so any test can ask for ``demo_site``. The
install runs at most once per test session: pip installs a copy of
``examples/demo-platform-plugin`` with ``--target`` into a session folder (about a second; no
network: ``--no-deps --no-build-isolation``), and every test that needs the package puts that
folder on ``PYTHONPATH`` (``run_python(..., sites=[demo_site])``) or ``sys.path``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from support import REPO, pip_install_into

DEMO_SOURCE = REPO / "examples" / "demo-platform-plugin"
DEMO_DISTRIBUTION = "sglang-launch-demo-platform"
DEMO_PACKAGE = "demo_platform_plugin"

_installed: Path | None = None


def install_demo(root: Path) -> Path:
    """pip-install the demo package into ``root / "site"`` and return that folder."""
    source = root / "source"
    # Build from a copy: setuptools writes build/ and *.egg-info/ beside the source.
    shutil.copytree(DEMO_SOURCE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = root / "site"
    started = time.perf_counter()
    proc = pip_install_into(source, target)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install the demo plugin:\n{proc.stdout}\n{proc.stderr}")
    print(
        f"[support.plugins] demo plugin installed with pip in {time.perf_counter() - started:.2f}s"
    )
    return target


@pytest.fixture(scope="session")
def demo_site(tmp_path_factory) -> Path:
    """A folder holding the pip-installed ``sglang-launch-demo-platform`` (one install per session)."""
    global _installed
    if _installed is None:
        _installed = install_demo(tmp_path_factory.mktemp("demo-plugin"))
    return _installed


# -- platform plugins as real dist-info distributions ------------------------------------------
_GROUPS = {"srt": "sglang.srt.platforms", "diffusion": "sglang.multimodal_gen.platforms"}
_BASES = {
    "srt": "from platforms import SRTPlatform as Base, PlatformEnum",
    "diffusion": "from platforms.diffusion import Platform as Base, PlatformEnum",
}
_ACTIVATE = {
    "on": "return {qualname!r}",
    "off": "return None",
    "raise": "raise RuntimeError('vendor runtime is broken')",
}


def platform_plugin(
    site: Path,
    name: str,
    *,
    runtime: str = "srt",
    activate: str = "on",
    distribution: str | None = None,
    class_body: str = "pass",
    tag: str = "",
) -> str:
    """Write a distribution with one platform entry point ``name`` for ``runtime``; return its
    package name (unique, so in-process tests never share module state).

    The package's ``__init__`` holds ``activate()`` (``activate`` = "on" returns the class, "off"
    None, "raise" raises, anything else is used as the function body) and ``CALLS`` (one pid per
    call); ``<package>.platform.Plat`` is the platform class (device "cpu"; ``class_body`` added).
    """
    import uuid

    package = f"plg_{name}_{tag or uuid.uuid4().hex[:8]}"
    qualname = f"{package}.platform.Plat"
    body = _ACTIVATE.get(activate, activate).format(qualname=qualname)
    from support import make_dist

    make_dist(
        site,
        distribution or f"dist-{package}".replace("_", "-"),
        entry_points={_GROUPS[runtime]: {name: f"{package}:activate"}},
        modules={
            f"{package}/__init__.py": (
                "import os\nCALLS = []\n\ndef activate():\n    CALLS.append(os.getpid())\n"
                + "".join(f"    {line}\n" for line in body.splitlines())
            ),
            f"{package}/platform.py": (
                f"{_BASES[runtime]}\n\nclass Plat(Base):\n    _enum = PlatformEnum.OOT\n"
                f"    device_name = {name!r}\n    device_type = 'cpu'\n"
                + "".join(f"    {line}\n" for line in class_body.splitlines())
            ),
        },
    )
    import importlib

    importlib.invalidate_caches()
    return package
