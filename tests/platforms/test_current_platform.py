"""The process-level platform state, in this process: ``current_platform`` and what it prints,
explicit selection importing one plugin only, ``pin_selection``, remembered failures,
``initialize_current_platform()``'s terminal failure, the entry-point snapshot a launcher hands
its children, the serving fallback, selection without hardware probes, and the pip-installed demo
plugin end to end.

Every test runs in ``fresh_process`` (``platforms.testing``): nothing is selected when it starts,
its ``site`` folder of real dist-info distributions is on ``sys.path``, and everything is restored
when it ends. What only a fresh interpreter can show (import neutrality, the first resolution in a
process racing threads, fork) is in ``test_platforms_process.py``.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from support.plugins import DEMO_DISTRIBUTION, platform_plugin

import platforms
import platforms.diffusion
from platforms import PlatformSelectionError, ProbeRequired
from platforms.custom_op import CustomOp
from platforms.testing import fresh_platforms

pytestmark = pytest.mark.usefixtures("fresh_process")


def test_print_current_platform_is_one_readable_line(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    print(platforms.current_platform)
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    assert line.startswith("CpuSRTPlatform (platforms.builtin.cpu) on device 'cpu'")
    assert "builtin:cpu" in line and "SGLANG_USE_CPU_ENGINE is set" in line


def test_messages_about_current_platform_name_the_vendors_class_not_the_proxy(site, monkeypatch):
    from serving.devices import cannot_run_message

    package = platform_plugin(site, "tiled", class_body="device_type = 'tt'")
    monkeypatch.setenv("SGLANG_PLATFORM", "tiled")
    proxy = platforms.current_platform
    try:
        platforms.device_mixin.placement(proxy, 0)
    except NotImplementedError as exc:
        message = cannot_run_message(proxy, exc)
    assert f"the selected platform plugin {package}.platform.Plat cannot run a model" in message
    assert "LazyPlatform" not in message
    assert "device_type 'tt' is not a torch device type" in message


def test_a_platform_without_get_device_is_placed_by_its_device_type(site, monkeypatch):
    platform_plugin(site, "placed")  # device_type 'cpu', no get_device
    monkeypatch.setenv("SGLANG_PLATFORM", "placed")
    assert platforms.device_mixin.placement(platforms.current_platform, 1) == torch.device("cpu", 1)


def test_explicit_selection_imports_only_the_named_plugin(site, monkeypatch):
    alpha, beta, gamma = (platform_plugin(site, name) for name in ("alpha", "beta", "gamma"))
    diffusion = platform_plugin(site, "vendor", runtime="diffusion")
    monkeypatch.setenv("SGLANG_PLATFORM", "beta")
    selection = platforms.current_selection()
    imported = sorted(p for p in (alpha, beta, gamma, diffusion) if p in sys.modules)
    assert imported == [beta], "explicit selection imported more than the selected plugin"
    assert f"{beta}.platform" not in sys.modules, "current_selection() imported the platform class"
    line = str(platforms.current_platform)
    assert selection.key == "plugin:beta"
    assert selection.distribution == f"dist-{beta}".replace("_", "-")
    assert line.startswith(f"Plat ({beta}.platform) on device 'cpu' [beta]")
    assert "selected by SGLANG_PLATFORM=beta" in line
    assert isinstance(platforms.current_platform, platforms.SRTPlatform)
    assert platforms.current_platform.device_name == "beta"
    assert platforms.current_selection() is selection
    assert len(sys.modules[beta].CALLS) == 1


def test_an_activation_that_touches_current_platform_gets_an_error_not_a_deadlock(site):
    platform_plugin(
        site,
        "loopy",
        runtime="diffusion",
        activate=(
            "from platforms.diffusion import current_platform\ncurrent_platform.device_name\nreturn None"
        ),
    )
    with pytest.raises(PlatformSelectionError) as caught:
        platforms.diffusion.current_platform.device_name  # noqa: B018 - resolves the platform
    assert "was used while its platform was being selected" in str(caught.value)
    assert "move that code into init_backend()" in str(caught.value)


FAILING_PLATFORM = """
def init_backend(self):
    import sys
    sys.modules[__name__].INIT.append(1)
    raise RuntimeError("backend exploded")
"""


def test_a_failed_backend_initialization_is_terminal(site, monkeypatch):
    package = platform_plugin(site, "bad", runtime="diffusion", class_body=FAILING_PLATFORM)
    # The class module holds the state its init_backend uses.
    module = site / package / "platform.py"
    module.write_text("INIT = []\n" + module.read_text())
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "bad")
    errors = []
    for _ in range(3):
        with pytest.raises(RuntimeError) as caught:
            platforms.diffusion.initialize_current_platform()
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 1, "a later caller got a new error"
    assert str(errors[0]) == "backend exploded"
    assert importlib.import_module(f"{package}.platform").INIT == [1]


def test_pin_selection_and_remembered_failures(site, monkeypatch):
    platform_plugin(site, "alpha")
    monkeypatch.setenv("SGLANG_PLATFORM", "alpha")
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "missing")
    platforms.pin_selection("builtin:cpu")
    platforms.pin_selection("builtin:cpu")  # pinning again before resolution: fine
    srt = str(platforms.current_platform)
    platforms.pin_selection("builtin:cpu")  # the same key after resolution: fine
    # The pin wins over SGLANG_PLATFORM=alpha.
    assert srt.startswith("CpuSRTPlatform") and "pinned builtin:cpu" in srt
    with pytest.raises(PlatformSelectionError, match="already resolved builtin:cpu"):
        platforms.pin_selection("plugin:alpha")
    with pytest.raises(PlatformSelectionError, match="not a diffusion platform key"):
        platforms.diffusion.pin_selection("gpu")
    # Diffusion: the selection fails (no plugin named "missing"); the failure is remembered.
    errors = []
    for _ in range(2):
        with pytest.raises(PlatformSelectionError) as caught:
            platforms.diffusion.current_selection()
        errors.append(caught.value)
    assert errors[0] is errors[1]
    with pytest.raises(PlatformSelectionError, match="failed selection"):
        platforms.diffusion.pin_selection("builtin:cpu")


def test_children_adopt_the_parents_entry_point_reading(site):
    """A launcher reads entry-point metadata once and hands the table to its children: a child
    seeded with that snapshot sees the same entry points without reading metadata, and a process
    that has already read its own keeps its own."""
    from support import make_dist

    from platforms import entrypoints

    make_dist(site, "seeded-plugin", {"sglang.srt.plugins": {"seeded": "seeded_mod:register"}})
    rows = entrypoints.snapshot()
    entrypoints.reset()
    entrypoints.seed(rows + (("sglang.srt.plugins", "only-in-snapshot", "x:y", "ghost"),))
    seeded = [ep.name for ep in entrypoints.entry_points("sglang.srt.plugins")]
    entrypoints.seed(())  # already filled: ignored
    kept = [ep.name for ep in entrypoints.entry_points("sglang.srt.plugins")]
    assert seeded == ["seeded", "only-in-snapshot"]
    assert kept == seeded


def _selected(serve: bool) -> list[str]:
    """The SRT selection of a process that did (or did not) ask for the serving fallback."""
    with fresh_platforms():
        if serve:
            platforms.use_serving_fallback()
        selection = platforms.current_selection()
        return [selection.key, selection.reason]


def test_a_server_runs_on_the_cpu_where_the_srt_chart_ends_at_the_base_platform(site, monkeypatch):
    """``use_serving_fallback()``: with no plugin, nothing explicit and no accelerator, the spec's
    chart ends at the bare SRTPlatform, which cannot run a model; a server gets the CPU platform
    instead and is told why. Without the call, and on every other branch, the chart is unchanged."""
    served = _selected(serve=True)
    plain = _selected(serve=False)
    assert served[0] == "builtin:cpu", served
    assert "so a server runs on the CPU platform" in served[1]
    assert "set SGLANG_PLATFORM or SGLANG_USE_CPU_ENGINE=1" in served[1]
    assert plain[0] == "builtin:base", plain

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert _selected(serve=True) == [
        "builtin:cpu",
        "fallback: no platform plugin installed and SGLANG_USE_CPU_ENGINE is set",
    ]
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE")

    platform_plugin(site, "on")
    with_plugin = _selected(serve=True)
    assert with_plugin[0] == "plugin:on", with_plugin


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """The names of the built-in hardware probes run, in order (each still runs for real)."""
    ran: list[str] = []
    for name in ("cuda", "rocm", "xpu", "mps", "npu", "musa"):
        module = importlib.import_module(f"platforms.builtin.{name}")
        real = module.available

        def counted(name=name, real=real):
            ran.append(name)
            return real()

        monkeypatch.setattr(module, "available", counted)
    return ran


def _without_probes(serve: bool, probes: list[str]) -> dict:
    """Both runtimes' ``current_selection(probe=False)`` in a fresh block, the probes that ran
    meanwhile, and what a selection made afterwards (probing) picks."""
    out: dict = {}
    probes.clear()
    with fresh_platforms():
        if serve:
            platforms.use_serving_fallback()
        for name, module in (("srt", platforms), ("diffusion", platforms.diffusion)):
            try:
                s = module.current_selection(probe=False)
                out[name] = ["selected", s.key, s.reason]
            except ProbeRequired as need:
                out[name] = ["probe", list(need.builtins), need.serving_fallback, need.reason]
        out["probed"] = list(probes)
        out["then"] = platforms.current_selection().key  # nothing was remembered: this one probes
        out["probed_then"] = list(probes)
    return out


def test_current_selection_without_probes(site, monkeypatch, probes):
    """``current_selection(probe=False)`` runs no hardware probe: where only a probe could decide
    it raises ``ProbeRequired`` naming the built-ins in probing order (with the server's stand-in
    after ``use_serving_fallback()``) and remembers nothing; a plugin that activates, or an
    environment-only built-in, is selected as usual. (That it imports no torch is checked in a
    fresh interpreter, in ``test_platforms_process.py``.)"""
    bare = _without_probes(serve=False, probes=probes)
    assert bare["srt"] == [
        "probe",
        ["cuda", "rocm", "xpu", "base"],
        None,
        "fallback: no platform plugin installed",
    ]
    assert bare["diffusion"][:3] == [
        "probe",
        ["mps", "xpu", "rocm", "cuda", "npu", "musa", "cpu"],
        None,
    ]
    assert bare["probed"] == [], bare
    assert bare["then"].startswith("builtin:")  # probed now: base here, an accelerator's elsewhere
    assert bare["probed_then"][:1] == ["cuda"], bare

    served = _without_probes(serve=True, probes=probes)
    assert served["srt"][:3] == ["probe", ["cuda", "rocm", "xpu", "base"], "cpu"], served
    assert served["probed"] == [] and served["then"].startswith("builtin:"), served

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    cpu_engine = _without_probes(serve=False, probes=probes)
    assert cpu_engine["srt"][:2] == ["selected", "builtin:cpu"], cpu_engine
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE")

    platform_plugin(site, "on")
    with_plugin = _without_probes(serve=False, probes=probes)
    assert with_plugin["srt"][:2] == ["selected", "plugin:on"], with_plugin
    assert with_plugin["probed"] == [], with_plugin


# -- the demo package, installed by pip -------------------------------------------------------
def _demo_checks(enabled: bool) -> dict:
    """What the demo platform does in both runtimes (the device checks only where enabled)."""
    out: dict = {}
    srt = platforms.current_platform
    diff = platforms.diffusion.current_platform
    out["srt_line"] = str(srt)
    out["diff_selection"] = [
        platforms.diffusion.current_selection().key,
        platforms.diffusion.current_selection().distribution,
    ]
    if not enabled:
        return out
    import demo_platform_plugin
    import demo_platform_plugin.ops as ops

    platforms.initialize_current_platform()
    platforms.diffusion.initialize_current_platform()
    out["init_calls"] = len(demo_platform_plugin.INIT_CALLS)
    out["device"] = [
        str(srt.get_device(0)),
        srt.device_type,
        srt.get_device_name(),
        srt.is_out_of_tree(),
        srt.is_cpu(),
        diff.is_out_of_tree(),
        diff.get_torch_library_dispatch_key(),
        diff.get_dispatch_key_name(),
    ]
    x = torch.ones(3, 4, device=diff.get_local_torch_device())
    norm = ops.RMSNorm(4)
    out["registered"] = [bool(torch.allclose(norm(x), x)), ops.DEMO_FORWARD_CALLS]

    class ByKey(CustomOp):
        def forward_demo(self, x):
            return "forward_demo"

        def forward_native(self, x):
            return "forward_native"

    class ByOot(CustomOp):
        def forward_oot(self, x):
            return "forward_oot"

        def forward_native(self, x):
            return "forward_native"

    class Native(CustomOp):
        def forward_native(self, x):
            return "forward_native"

    class Sub(ByKey):
        pass

    CustomOp.register_oot_forward(ByKey, lambda op, x: f"registered:{type(op).__name__}", "demo")
    CustomOp.register_oot_forward(Native, lambda op, x: "wrong key", "cuda")
    built_before = ByOot()
    CustomOp.register_oot_forward(ByOot, lambda op, x: "registered:ByOot", "demo")
    out["dispatch"] = [ByKey()(1), Sub()(1), ByOot()(1), built_before(1), Native()(1)]
    with pytest.raises(TypeError) as caught:
        CustomOp.register_oot_forward(int, lambda op: None, "demo")
    out["bad_registration"] = str(caught.value)
    return out


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_installed_with_pip_disabled(demo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(demo_site))
    data = _demo_checks(enabled=False)
    assert data["srt_line"].startswith("SRTPlatform (platforms.interface)")
    assert "no platform plugin activated" in data["srt_line"]
    assert data["diff_selection"][1] is None


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_installed_with_pip_end_to_end(demo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(demo_site))
    monkeypatch.setenv("DEMO_PLATFORM_ENABLE", "1")
    data = _demo_checks(enabled=True)
    assert data["srt_line"].startswith(
        "DemoSRTPlatform (demo_platform_plugin.platform) on device 'cpu' [demo]"
    )
    assert (
        f"plugin:demo from {DEMO_DISTRIBUTION}" in data["srt_line"]
        and "automatic discovery" in data["srt_line"]
    )
    assert data["diff_selection"] == ["plugin:demo", DEMO_DISTRIBUTION]
    assert data["init_calls"] == 2  # once per runtime
    device, device_type, name, oot, is_cpu, diff_oot, torch_key, key_name = data["device"]
    assert (device, device_type, oot, is_cpu, diff_oot) == ("cpu", "cpu", True, False, True)
    assert name.startswith("Demo accelerator (CPU underneath") and (torch_key, key_name) == (
        "CPU",
        "demo",
    )
    assert data["registered"] == [True, 1]
    # registration (exact class), forward_<key>, registration made before construction, an op
    # built before the registration keeps forward_oot, a registration for another key is ignored.
    assert data["dispatch"] == [
        "registered:ByKey",
        "forward_demo",
        "registered:ByOot",
        "forward_oot",
        "forward_native",
    ]
    assert "must be a CustomOp subclass" in data["bad_registration"]


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_init_failure_is_terminal(demo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(demo_site))
    for name, value in (
        ("SGLANG_PLATFORM", "demo"),
        ("DEMO_PLATFORM_ENABLE", "1"),
        ("DEMO_PLATFORM_FAIL_INIT", "1"),
    ):
        monkeypatch.setenv(name, value)
    messages = []
    for _ in range(2):
        with pytest.raises(RuntimeError) as caught:
            platforms.initialize_current_platform()
        messages.append(str(caught.value))
    assert messages == ["demo platform: DEMO_PLATFORM_FAIL_INIT=1"] * 2


@pytest.mark.e2e  # pip-installs the demo plugin
def test_explicit_demo_when_disabled_names_the_fix(demo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(demo_site))
    monkeypatch.setenv("SGLANG_PLATFORM", "demo")
    with pytest.raises(PlatformSelectionError) as caught:
        str(platforms.current_platform)
    assert "activate() returned None" in str(caught.value)
    assert f"demo = demo_platform_plugin:activate (from {DEMO_DISTRIBUTION})" in str(caught.value)
