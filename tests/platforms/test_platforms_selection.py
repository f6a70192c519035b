"""Every branch of both selection charts and every selection error, in this process.

These call the one selection algorithm (``platforms._selection.resolve`` / ``instantiate``) on a
runtime's ``RuntimeSpec`` directly, with real entry points: dist-info distributions written into
a site folder on ``sys.path``. Nothing here touches the process-level ``current_platform``
singletons (``test_platforms_process.py`` checks those in fresh interpreters). Where a branch
depends on hardware this machine lacks (CUDA, ROCm, XPU, MPS, NPU, MUSA), the test stands in
for the device by replacing torch's query or the built-in's probe, and says so.
"""

from __future__ import annotations

import importlib
import re
import sys

import pytest
from support import drivers_present, make_dist
from support.plugins import platform_plugin

from platforms import entrypoints
from platforms._selection import PlatformSelectionError, instantiate, resolve
from platforms.runtimes import DIFFUSION, SRT, runtime_spec


@pytest.fixture
def plugins(site, monkeypatch):
    """Write plugins with ``plugins(name, ...)``; their site is on ``sys.path`` for the test."""
    monkeypatch.syspath_prepend(str(site))
    entrypoints.reset()
    written: list[str] = []

    def make(name: str, **kwargs) -> str:
        package = platform_plugin(site, name, **kwargs)
        written.append(package)
        entrypoints.reset()
        return package

    yield make
    entrypoints.reset()
    for mod in [m for m in sys.modules if m.split(".")[0] in written]:
        del sys.modules[mod]


def imported(package: str) -> bool:
    return package in sys.modules


def calls(package: str) -> int:
    return len(importlib.import_module(package).CALLS)


@pytest.fixture
def no_accelerator(monkeypatch):
    """Whatever this machine has, the built-in probes report no accelerator (stand-in)."""
    for name in ("cuda", "rocm", "xpu", "mps", "npu", "musa"):
        module = importlib.import_module(f"platforms.builtin.{name}")
        monkeypatch.setattr(module, "available", lambda: False)


# -- SRT: explicit SGLANG_PLATFORM -----------------------------------------------------------
def test_srt_explicit_loads_only_the_named_plugin(plugins):
    a = plugins("alpha")
    b = plugins("beta")
    c = plugins("gamma", activate="raise")
    # SGLANG_PLUGINS filters automatic discovery only; explicit selection ignores it.
    sel = resolve(SRT, {"SGLANG_PLATFORM": "beta", "SGLANG_PLUGINS": "alpha"})
    assert (sel.key, sel.qualname, sel.reason) == (
        "plugin:beta",
        f"{b}.platform.Plat",
        "SGLANG_PLATFORM=beta",
    )
    assert sel.distribution == f"dist-{b}".replace("_", "-") and sel.entry_point.name == "beta"
    assert calls(b) == 1
    assert not imported(a) and not imported(c), "explicit selection imported another plugin"
    assert not imported(f"{b}.platform"), "the class module is imported only when constructed"
    platform = instantiate(SRT, sel)
    assert type(platform).__module__ == f"{b}.platform" and platform.is_out_of_tree()


def test_srt_explicit_unknown_name_lists_what_is_installed(plugins):
    plugins("alpha")
    with pytest.raises(PlatformSelectionError) as err:
        resolve(SRT, {"SGLANG_PLATFORM": "kunlun"})
    msg = str(err.value)
    assert "'kunlun'" in msg and "alpha = plg_alpha" in msg and "SGLANG_PLATFORM" in msg


def test_srt_explicit_with_nothing_installed_says_so(plugins):
    with pytest.raises(PlatformSelectionError, match="found: none installed"):
        resolve(SRT, {"SGLANG_PLATFORM": "cpu"})


def test_srt_explicit_hardware_unavailable(plugins):
    p = plugins("alpha", activate="off")
    with pytest.raises(PlatformSelectionError, match=r"activate\(\) returned None .*hardware"):
        resolve(SRT, {"SGLANG_PLATFORM": "alpha"})
    assert calls(p) == 1


def test_srt_explicit_raising_callback(plugins):
    plugins("alpha", activate="raise")
    with pytest.raises(
        PlatformSelectionError, match="raised RuntimeError: vendor runtime is broken"
    ) as err:
        resolve(SRT, {"SGLANG_PLATFORM": "alpha"})
    assert isinstance(err.value.__cause__, RuntimeError)


def test_srt_explicit_name_of_two_distributions_is_an_error(plugins):
    first = plugins("alpha", distribution="acme-one")
    second = plugins("alpha", distribution="acme-two")
    with pytest.raises(PlatformSelectionError) as err:
        resolve(SRT, {"SGLANG_PLATFORM": "alpha"})
    msg = str(err.value)
    assert "2 installed distributions register a srt platform named 'alpha'" in msg
    assert "(from acme-one)" in msg and "(from acme-two)" in msg and "uninstall all but one" in msg
    assert not imported(first) and not imported(second)


def test_platform_entry_point_at_a_non_callable(plugins, site):
    package = plugins("alpha")
    make_dist(site, "acme-broken", {"sglang.srt.platforms": {"broken": f"{package}:CALLS"}})
    entrypoints.reset()
    for environ in ({"SGLANG_PLATFORM": "broken"}, {"SGLANG_PLUGINS": "broken"}):
        with pytest.raises(
            PlatformSelectionError,
            match=r"broken = .*:CALLS \(from acme-broken\) points at "
            r"a list, not a zero-argument activate\(\) function",
        ):
            resolve(SRT, environ)


# -- SRT: automatic discovery ----------------------------------------------------------------
def test_srt_auto_one_activated(plugins):
    off = plugins("alpha", activate="off")
    on = plugins("beta")
    sel = resolve(SRT, {})
    assert sel.key == "plugin:beta" and "automatic discovery" in sel.reason
    assert calls(off) == 1 and calls(on) == 1, "automatic discovery activates every plugin"


def test_srt_auto_several_activated_is_an_error(plugins):
    plugins("alpha")
    plugins("beta")
    with pytest.raises(PlatformSelectionError) as err:
        resolve(SRT, {})
    msg = str(err.value)
    assert "2 srt platform plugins activated" in msg and "alpha" in msg and "beta" in msg
    assert re.search(
        r"set SGLANG_PLATFORM to the one to use, e.g. SGLANG_PLATFORM=(alpha|beta)$", msg
    )


def test_srt_auto_is_filtered_by_sglang_plugins(plugins):
    a = plugins("alpha")
    b = plugins("beta")
    sel = resolve(SRT, {"SGLANG_PLUGINS": " beta , some_hook_plugin"})
    assert sel.key == "plugin:beta"
    assert not imported(a), "a plugin left out by SGLANG_PLUGINS was imported"
    assert calls(b) == 1


def test_srt_auto_with_every_platform_plugin_left_out_says_how_to_admit_them(
    plugins, no_accelerator
):
    a = plugins("alpha", distribution="acme-alpha")
    b = plugins("beta", activate="off", distribution="acme-beta")
    sel = resolve(SRT, {"SGLANG_PLUGINS": "some_hook_plugin"})
    assert sel.key == "builtin:base" and not imported(a) and not imported(b)
    assert sel.reason.startswith(
        "fallback: no platform plugin allowed (SGLANG_PLUGINS=some_hook_plugin leaves out "
    )
    assert (
        f"alpha = {a}:activate (from acme-alpha)" in sel.reason
        and f"beta = {b}:activate (from acme-beta)" in sel.reason
    )
    assert sel.reason.endswith(
        "; add their names to SGLANG_PLUGINS, or unset it, to admit them to automatic "
        "selection, or set SGLANG_PLATFORM to one to select it) and neither SGLANG_USE_CPU_ENGINE "
        "nor CUDA, ROCm or XPU is available"
    )
    partly = resolve(SRT, {"SGLANG_PLUGINS": "beta"})  # the allowed one does not activate
    assert partly.reason.startswith(
        "fallback: no platform plugin activated (SGLANG_PLUGINS=beta leaves out alpha"
    )


def test_srt_auto_raising_callback_aborts(plugins):
    plugins("alpha", activate="raise")
    with pytest.raises(PlatformSelectionError, match="rather than fall back"):
        resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "1"})


def test_srt_fallback_cpu_engine(plugins):
    plugins("alpha", activate="off")
    sel = resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "1"})
    assert sel.key == "builtin:cpu" and sel.distribution is None
    assert sel.reason == "fallback: no platform plugin activated and SGLANG_USE_CPU_ENGINE is set"
    assert type(instantiate(SRT, sel)).__name__ == "CpuSRTPlatform"


def test_srt_cpu_engine_flag_must_be_boolean(plugins):
    with pytest.raises(
        PlatformSelectionError, match="SGLANG_USE_CPU_ENGINE='maybe' is not a boolean"
    ):
        resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "maybe"})


def test_srt_fallback_chain_cuda_rocm_xpu_base(plugins, monkeypatch):
    """Stand-in for hardware this machine lacks: torch's own queries answer as on that hardware."""
    import torch

    drivers_present(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "0"}).key == "builtin:cuda"
    # CPU engine outranks CUDA.
    assert resolve(SRT, {"SGLANG_USE_CPU_ENGINE": "true"}).key == "builtin:cpu"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert resolve(SRT, {}).key == "builtin:rocm"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(
        torch,
        "xpu",
        type("FakeXpu", (), {"is_available": staticmethod(lambda: True)}),
        raising=False,
    )
    assert resolve(SRT, {}).key == "builtin:xpu"
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    sel = resolve(SRT, {})
    assert sel.key == "builtin:base" and sel.qualname == "platforms.interface.SRTPlatform"
    assert "no platform plugin installed" in sel.reason


# -- diffusion -------------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ["cpu", "cuda", "ROCM", "mps", "npu", "musa"])
def test_diffusion_override_builtin_alias_without_probing(plugins, monkeypatch, alias):
    def probe_must_not_run():
        raise AssertionError("a built-in alias must not probe hardware")

    for name in ("cuda", "rocm", "xpu", "mps", "npu", "musa"):
        monkeypatch.setattr(
            importlib.import_module(f"platforms.builtin.{name}"), "available", probe_must_not_run
        )
    p = plugins("other", runtime="diffusion")
    sel = resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": alias})
    assert sel.key == f"builtin:{alias.lower()}" and "not probed" in sel.reason
    assert not imported(p)


def test_diffusion_override_xpu_is_automatic_only(plugins):
    with pytest.raises(
        PlatformSelectionError, match="selected automatically only; unset SGLANG_DIFFUSION"
    ):
        resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "xpu"})


def test_diffusion_override_plugin_loads_only_it(plugins):
    a = plugins("vendor_a", runtime="diffusion")
    b = plugins("vendor_b", runtime="diffusion", activate="raise")
    # Unrelated duplicates and reserved names are not validated under explicit selection.
    d1 = plugins("dup", runtime="diffusion")
    d2 = plugins("dup", runtime="diffusion")
    r = plugins("cuda", runtime="diffusion")
    sel = resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "vendor_a"})
    assert sel.key == "plugin:vendor_a" and sel.distribution == f"dist-{a}".replace("_", "-")
    assert not any(imported(p) for p in (b, d1, d2, r))
    platform = instantiate(DIFFUSION, sel)
    assert platform.is_out_of_tree() and platform.device_name == "vendor_a"


def test_diffusion_override_errors(plugins):
    plugins("vendor_a", runtime="diffusion", activate="off")
    with pytest.raises(PlatformSelectionError, match="no diffusion platform plugin named 'nope'"):
        resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "nope"})
    with pytest.raises(
        PlatformSelectionError, match=r"returned None.*SGLANG_DIFFUSION_PLATFORM_OVERRIDE"
    ):
        resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "vendor_a"})


def test_diffusion_override_of_a_duplicated_name_is_ambiguous(plugins):
    plugins("dup", runtime="diffusion")
    plugins("dup", runtime="diffusion")
    with pytest.raises(
        PlatformSelectionError, match="2 installed distributions register .*uninstall all but one"
    ):
        resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "dup"})


def test_diffusion_auto_one_plugin_records_its_distribution(plugins, no_accelerator):
    plugins("vendor_a", runtime="diffusion", activate="off")
    b = plugins("vendor_b", runtime="diffusion", distribution="acme-diffusion-platform")
    sel = resolve(DIFFUSION, {})
    assert (sel.key, sel.distribution) == ("plugin:vendor_b", "acme-diffusion-platform")
    assert sel.qualname == f"{b}.platform.Plat"


def test_diffusion_auto_none_active_falls_back_to_builtins(plugins, no_accelerator):
    plugins("vendor_a", runtime="diffusion", activate="off")
    plugins("srt_only")  # an SRT plugin is not a diffusion candidate
    sel = resolve(DIFFUSION, {})
    assert sel.key == "builtin:cpu" and sel.reason.startswith(
        "fallback: no platform plugin activated"
    )


def test_diffusion_auto_several_active(plugins):
    plugins("vendor_a", runtime="diffusion")
    plugins("vendor_b", runtime="diffusion")
    with pytest.raises(
        PlatformSelectionError, match="set SGLANG_DIFFUSION_PLATFORM_OVERRIDE to the one"
    ):
        resolve(DIFFUSION, {})


def test_diffusion_auto_raising_callback_aborts_without_fallback(plugins):
    plugins("vendor_a", runtime="diffusion", activate="raise")
    with pytest.raises(PlatformSelectionError, match="rather than fall back to a built-in") as err:
        resolve(DIFFUSION, {})
    assert "vendor runtime is broken" in str(err.value)


def test_diffusion_auto_rejects_reserved_names(plugins):
    p = plugins("cuda", runtime="diffusion")
    with pytest.raises(PlatformSelectionError, match="reserved for built-in platforms") as err:
        resolve(DIFFUSION, {})
    assert "rename its entry point" in str(err.value)
    assert not imported(p)


def test_diffusion_auto_rejects_duplicate_names(plugins):
    p1 = plugins("vendor", runtime="diffusion", activate="off")
    p2 = plugins("vendor", runtime="diffusion", activate="off")
    with pytest.raises(PlatformSelectionError, match="share an entry-point name") as err:
        resolve(DIFFUSION, {})
    assert f"dist-{p1}".replace("_", "-") in str(err.value) and f"dist-{p2}".replace(
        "_", "-"
    ) in str(err.value)


def test_diffusion_ignores_the_srt_selectors(plugins, no_accelerator):
    plugins("vendor_a", runtime="diffusion")
    env = {"SGLANG_PLATFORM": "other", "SGLANG_PLUGINS": "nothing", "SGLANG_USE_CPU_ENGINE": "1"}
    assert resolve(DIFFUSION, env).key == "plugin:vendor_a"


def test_diffusion_builtin_order(plugins, monkeypatch):
    """Stand-in for hardware: each built-in's probe answers as if its device were present."""
    order = ["mps", "xpu", "rocm", "cuda", "npu", "musa"]
    present = set(order)
    for name in order:
        monkeypatch.setattr(
            importlib.import_module(f"platforms.builtin.{name}"),
            "available",
            lambda name=name: name in present,
        )
    seen = []
    for name in order:
        seen.append(resolve(DIFFUSION, {}).key)
        present.discard(name)
    seen.append(resolve(DIFFUSION, {}).key)
    assert seen == [f"builtin:{n}" for n in order + ["cpu"]]


# -- pinned keys -----------------------------------------------------------------------------
def test_pinned_builtin_is_not_probed_and_plugin_is_activated(plugins, monkeypatch):
    monkeypatch.setattr(
        importlib.import_module("platforms.builtin.cuda"),
        "available",
        lambda: pytest.fail("a pinned built-in must not be probed"),
    )
    sel = resolve(SRT, {"SGLANG_PLATFORM": "ignored"}, pinned="builtin:cuda")
    assert sel.key == "builtin:cuda" and "pinned builtin:cuda" in sel.reason
    p = plugins("alpha")
    assert resolve(SRT, {}, pinned="plugin:alpha").key == "plugin:alpha" and calls(p) == 1
    off = plugins("beta", activate="off")
    with pytest.raises(PlatformSelectionError, match="pinned key 'plugin:beta'.*returned None"):
        resolve(SRT, {}, pinned="plugin:beta")
    assert calls(off) == 1


@pytest.mark.parametrize(
    "key, fragment",
    [
        ("cuda", "expected 'plugin:<entry-point name>'"),
        ("plugin:", "expected 'plugin:<entry-point name>'"),
        ("builtin:tpu", "names no srt built-in platform"),
    ],
)
def test_malformed_pinned_keys(plugins, key, fragment):
    with pytest.raises(PlatformSelectionError, match=fragment):
        resolve(SRT, {}, pinned=key)


# -- broken plugins --------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
@pytest.mark.parametrize(
    "activate, class_body, fragment",
    [
        ("return 42", "pass", "returned 42; it must return the platform class's qualified name"),
        ("return 'no_such_pkg.mod.Cls'", "pass", "cannot be imported: ModuleNotFoundError"),
        ("return 'collections.OrderedDict'", "pass", "is not a subclass of"),
        (
            "return {qualname!r}",
            "def __init__(self, device):\n    pass",
            "constructible with no arguments",
        ),
        (
            "return {qualname!r}",
            "def __init__(self):\n    raise OSError('no device node')",
            "OSError: no device node",
        ),
    ],
)
def test_broken_plugin_errors_name_the_plugin_and_the_fix(
    plugins, runtime, activate, class_body, fragment
):
    spec = runtime_spec(runtime)
    plugins(
        "broken",
        runtime=runtime,
        activate=activate,
        class_body=class_body,
        distribution="broken-vendor",
    )
    with pytest.raises(PlatformSelectionError, match=fragment) as err:
        instantiate(spec, resolve(spec, {spec.selector_env: "broken"}))
    assert "broken-vendor" in str(err.value) or "Plat" in str(err.value)


def test_platform_class_must_use_its_runtimes_enum(plugins):
    plugins(
        "mixed",
        runtime="diffusion",
        class_body="from platforms import PlatformEnum as SRTEnum\n_enum = SRTEnum.OOT",
    )
    sel = resolve(DIFFUSION, {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "mixed"})
    with pytest.raises(
        PlatformSelectionError, match="not a platforms.diffusion.interface.PlatformEnum member"
    ):
        instantiate(DIFFUSION, sel)


def test_entry_point_that_cannot_be_imported(plugins, site):
    from support import make_dist

    make_dist(
        site,
        "ghost-vendor",
        entry_points={"sglang.srt.platforms": {"ghost": "ghost_pkg_missing:activate"}},
    )
    entrypoints.reset()
    with pytest.raises(
        PlatformSelectionError, match="cannot import the activation callback .*ghost-vendor"
    ):
        resolve(SRT, {})


def test_unknown_runtime_name():
    with pytest.raises(ValueError, match="known runtimes: srt, diffusion"):
        runtime_spec("tpu")


# -- a plugin's class must be out of tree and name its device --------------------------------
@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_activation_returning_a_builtin_class_is_refused_naming_it(plugins, runtime):
    builtin = {
        "srt": "platforms.builtin.cpu.CpuSRTPlatform",
        "diffusion": "platforms.builtin.cpu.CpuPlatform",
    }
    spec = runtime_spec(runtime)
    plugins(
        "borrowed",
        runtime=runtime,
        activate=f"return {builtin[runtime]!r}",
        distribution="borrow-vendor",
    )
    sel = resolve(spec, {spec.selector_env: "borrowed"})
    with pytest.raises(PlatformSelectionError) as err:
        instantiate(spec, sel)
    message = str(err.value)
    assert builtin[runtime] in message and "borrow-vendor" in message
    assert "_enum is <PlatformEnum.CPU" in message and "_enum = PlatformEnum.OOT" in message


@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
@pytest.mark.parametrize(
    "class_body, attr, fragment",
    [
        ("device_name = ''", "device_name", "device_name is ''"),
        ("device_type = '   '", "device_type", "device_type is '   '"),
        ("device_type = None", "device_type", "device_type is None"),
        (
            "del device_name",
            "device_name",
            "device_name is not set",
        ),  # left at DeviceMixin's placeholder
    ],
)
def test_activation_returning_a_class_without_a_device_identity_is_refused(
    plugins, runtime, class_body, attr, fragment
):
    spec = runtime_spec(runtime)
    package = plugins("blank", runtime=runtime, class_body=class_body)
    sel = resolve(spec, {spec.selector_env: "blank"})
    with pytest.raises(PlatformSelectionError) as err:
        instantiate(spec, sel)
    message = str(err.value)
    assert f"{package}.platform.Plat" in message and fragment in message
    assert f"set {attr} to a non-blank string" in message and "or in __init__" in message


@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_a_class_that_names_its_device_in_init_is_accepted_as_sglang_accepts_it(plugins, runtime):
    # sglang-plugin-FL's shape: no class attribute, the identity set by __init__ from a detector.
    body = (
        "del device_name, device_type\n"
        "def __init__(self):\n"
        "    super().__init__()\n"
        "    detected = 'cpu'  # what the vendor's device detector reports\n"
        "    self.device_name = detected\n"
        "    self.device_type = detected\n"
    )
    spec = runtime_spec(runtime)
    package = plugins("detected", runtime=runtime, class_body=body)
    platform = instantiate(spec, resolve(spec, {spec.selector_env: "detected"}))
    assert type(platform).__module__ == f"{package}.platform"
    assert (platform.device_name, platform.device_type) == ("cpu", "cpu")


def test_a_class_whose_init_leaves_its_device_unnamed_is_still_refused_after_construction(
    plugins,
):
    body = "del device_type\ndef __init__(self):\n    self.device_name = 'mine'\n"
    plugins("halfnamed", class_body=body)
    with pytest.raises(PlatformSelectionError, match="device_type is not set once constructed"):
        instantiate(SRT, resolve(SRT, {"SGLANG_PLATFORM": "halfnamed"}))


def test_a_plugin_class_with_a_builtin_enum_member_is_refused(plugins):
    plugins("posing", class_body="_enum = PlatformEnum.CUDA")
    with pytest.raises(
        PlatformSelectionError, match="_enum is <PlatformEnum.CUDA.*not PlatformEnum.OOT"
    ):
        instantiate(SRT, resolve(SRT, {"SGLANG_PLATFORM": "posing"}))
