"""Selection errors are the exception types plugin code written for SGLang catches.

SGLang raises a ``RuntimeError`` for an unknown ``SGLANG_PLATFORM``, a ``ValueError`` for an unknown
``SGLANG_DIFFUSION_PLATFORM_OVERRIDE``, a ``TypeError`` for a class that is not its runtime's
platform or an ``activate()`` that returns no class name, and lets a plugin's own ``ImportError``
through. Here every one of them is a ``PlatformSelectionError`` and also that type, so an
``except ValueError`` (or ``TypeError``, ``ImportError``) ported from SGLang still catches it.
Real dist-info plugins on ``sys.path``; the one selection algorithm, in this process.
"""

from __future__ import annotations

import sys

import pytest
from support.plugins import platform_plugin

import platforms
from platforms import entrypoints
from platforms._selection import instantiate, resolve
from platforms.runtimes import DIFFUSION, SRT


@pytest.fixture
def plugin(site, monkeypatch):
    """``plugin(name, ...)`` writes a platform plugin whose site is on ``sys.path``."""
    monkeypatch.syspath_prepend(str(site))
    written: list[str] = []

    def make(name: str, **kwargs: str) -> str:
        package = platform_plugin(site, name, **kwargs)
        written.append(package)
        entrypoints.reset()
        return package

    yield make
    entrypoints.reset()
    for module in [m for m in sys.modules if m.split(".")[0] in written]:
        del sys.modules[module]


def _select(spec, environ):
    return instantiate(spec, resolve(spec, environ))


def test_an_unknown_selector_name_is_what_each_runtime_raises_in_sglang(plugin):
    plugin("alpha")
    plugin("alpha", runtime="diffusion")
    with pytest.raises(RuntimeError, match="no srt platform plugin named 'kunlun'") as srt:
        resolve(SRT, {"SGLANG_PLATFORM": "kunlun"})
    with pytest.raises(ValueError, match="no diffusion platform plugin named 'kunlun'") as dif:
        resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "kunlun"})
    for caught in (srt.value, dif.value):
        assert isinstance(caught, platforms.PlatformNotFoundError)
        assert isinstance(caught, platforms.PlatformSelectionError)


@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_a_plugin_whose_vendor_runtime_is_missing_raises_its_own_import_error(plugin, runtime):
    plugin("vendor", runtime=runtime, activate="import vendor_runtime_that_is_absent")
    spec = SRT if runtime == "srt" else DIFFUSION
    try:
        resolve(spec, {spec.selector_env: "vendor"})
    except ImportError as exc:  # what a port from SGLang catches
        assert exc.name == "vendor_runtime_that_is_absent"
        assert isinstance(exc, platforms.PlatformSelectionError)
        assert "activate() of" in str(exc) and "vendor" in str(exc)
    else:
        pytest.fail("selection did not raise")


@pytest.mark.parametrize(
    ("activate", "class_body", "expected"),
    [
        ("return 42", "pass", "returned 42"),
        ("return ''", "pass", "returned ''"),
        ("return {qualname!r}", "_enum = None", "sets _enum = None"),
        ("return {qualname!r}", "device_name = '  '", "whose device_name is '  '"),
        ("return 'builtins.dict'", "pass", "not a subclass"),
    ],
)
def test_a_plugin_that_hands_selection_the_wrong_kind_of_thing_is_a_type_error(
    plugin, activate, class_body, expected
):
    plugin("odd", activate=activate, class_body=class_body)
    with pytest.raises(TypeError, match=expected) as caught:
        _select(SRT, {"SGLANG_PLATFORM": "odd"})
    assert isinstance(caught.value, platforms.PlatformTypeError)


def test_a_class_path_whose_module_or_class_is_missing_keeps_its_import_type(plugin):
    plugin("nomod", activate="return 'absent_vendor_package.platform.Plat'")
    with pytest.raises(ImportError, match="cannot be imported") as no_module:
        _select(SRT, {"SGLANG_PLATFORM": "nomod"})
    assert no_module.value.name == "absent_vendor_package"
    package = plugin("noclass", runtime="diffusion", activate="return __name__ + '.platform.Gone'")
    with pytest.raises(AttributeError, match="cannot be imported") as no_class:
        _select(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "noclass"})
    assert f"{package}.platform.Gone" in str(no_class.value)
    for caught in (no_module.value, no_class.value):
        assert isinstance(caught, platforms.PlatformSelectionError)


def test_errors_of_no_particular_type_stay_runtime_errors(plugin):
    plugin("off", activate="off")
    with pytest.raises(platforms.PlatformSelectionError, match="returned None") as caught:
        resolve(SRT, {"SGLANG_PLATFORM": "off"})
    assert type(caught.value) is platforms.PlatformSelectionError
    assert isinstance(caught.value, RuntimeError)
    with pytest.raises(ValueError, match="is not a boolean"):
        resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "maybe"})
