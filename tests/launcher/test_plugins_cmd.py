"""``sglang-launch plugins``: the human table and ``--json``, over real installed entry points;
it reports (never raises) selection errors, resolves no hook target and imports no torch.

The command runs in this process, in ``fresh_process`` (``hooks.testing``: no platform selected
and no plugin loaded when a test starts, every hook target restored when it ends); what it
imports, and its exit status, are checked where they show: in a fresh interpreter, and by
running the command as its own process.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import subprocess
import sys

import pytest
from support import REPO, clean_env, free_port, make_dist, run_python
from support.process import forget_modules_from

import hooks
from hooks.testing import fresh_plugins
from launcher.cli import main

SRT_PLUGINS = "sglang.srt.plugins"
SRT_PLATFORMS = "sglang.srt.platforms"
DIFF_PLUGINS = "sglang.multimodal_gen.plugins"


def _run(*argv: str) -> tuple[int, str]:
    """``sglang-launch ARGV`` in this process: its exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def _platform_module(cls: str, device: str) -> str:
    """The source of a module holding a valid SRT platform plugin class ``cls`` (the report
    constructs the selected class, as a launch does)."""
    return (
        "from platforms import SRTPlatform, PlatformEnum\n\n"
        f"class {cls}(SRTPlatform):\n    _enum = PlatformEnum.OOT\n"
        f"    device_name = {device!r}\n    device_type = 'cpu'\n"
    )


def _site(site):
    make_dist(site, "tgt-module", modules={"tgt.py": "def f(x):\n    return x\n"})
    make_dist(
        site,
        "vendor-platform",
        {
            SRT_PLATFORMS: {"vendor": "vendor_pkg:activate"},
            SRT_PLUGINS: {"vendor": "vendor_pkg.hooks:register"},
        },
        {
            "vendor_pkg/__init__.py": "def activate():\n    return 'vendor_pkg.platform.VendorPlatform'\n",
            "vendor_pkg/platform.py": _platform_module("VendorPlatform", "vendor"),
            "vendor_pkg/hooks.py": """
                   from hooks import HookRegistry, HookType
                   def register():
                       HookRegistry.register("tgt.f", lambda x: ("vendor", x), HookType.REPLACE)
               """,
        },
    )
    make_dist(
        site,
        "other-platform",
        {
            SRT_PLATFORMS: {"other": "other_pkg:activate"},
            SRT_PLUGINS: {"other_extra": "other_pkg.hooks:register"},
        },
        {
            "other_pkg/__init__.py": "def activate():\n    return None\n",
            "other_pkg/hooks.py": "def register():\n    raise AssertionError('must be skipped')\n",
        },
    )
    make_dist(
        site,
        "plain-plugin",
        {
            SRT_PLUGINS: {"plain": "plain_mod:register"},
            DIFF_PLUGINS: {"plain": "plain_mod:register_diffusion"},
        },
        {
            "plain_mod.py": """
                  from hooks import HookRegistry, HookType
                  def register():
                      HookRegistry.register("tgt:f", lambda x: ("plain", x), HookType.REPLACE)
                      HookRegistry.register("launchspec.server_args.ServerArgs.check_server_args",
                                            lambda self: None, HookType.BEFORE)
                  def register_diffusion():
                      from hooks.diffusion import HookRegistry, HookType
                      HookRegistry.register("tgt.f", lambda result, x: result, HookType.AFTER)
              """
        },
    )
    make_dist(
        site,
        "off-plugin",
        {SRT_PLUGINS: {"off": "off_mod:register"}},
        {"off_mod.py": "def register():\n    raise AssertionError('not allowed, must not run')\n"},
    )


@pytest.mark.usefixtures("fresh_process")
def test_table_and_json_report_every_entry_point_selection_hooks_and_conflicts(site, monkeypatch):
    _site(site)
    monkeypatch.setenv("SGLANG_PLATFORM", "vendor")
    monkeypatch.setenv("SGLANG_PLUGINS", "vendor,plain,other_extra")
    table_code, table = _run("plugins")
    json_code, doc = _run("plugins", "--json")
    assert [table_code, json_code] == [0, 0]
    assert "tgt" not in sys.modules  # no hook applied, no target resolved
    out = {"table": table, "doc": json.loads(doc)}

    srt, diffusion = out["doc"]["runtimes"]
    assert srt["runtime"] == "srt" and diffusion["runtime"] == "diffusion"
    assert srt["selection"]["key"] == "plugin:vendor"
    assert srt["selection"]["distribution"] == "vendor-platform"
    assert srt["selection"]["reason"] == "SGLANG_PLATFORM=vendor"
    assert srt["allowlist"] == ["other_extra", "plain", "vendor"]
    platforms = {p["name"]: p for p in srt["groups"][SRT_PLATFORMS]}
    assert platforms["vendor"]["selected"] and not platforms["other"]["selected"]
    assert platforms["other"]["distribution"] == "other-platform"
    # SGLANG_PLATFORM selects explicitly: SGLANG_PLUGINS has no say in platform selection.
    assert srt["platform_allowlist"] == {"variable": "SGLANG_PLUGINS", "applies": False}
    assert platforms["vendor"]["allowed"] is None and platforms["other"]["allowed"] is None
    assert diffusion["platform_allowlist"] is None
    plugins = {p["name"]: p for p in srt["groups"][SRT_PLUGINS]}
    assert set(plugins) == {"vendor", "other_extra", "plain", "off"}
    assert plugins["off"]["allowed"] is False and plugins["off"]["status"] == "not allowed"
    assert plugins["other_extra"]["skipped_unselected_platform"] is True
    assert plugins["other_extra"]["status"] == "skipped"
    assert (
        plugins["plain"]["status"] == "loaded"
        and plugins["plain"]["distribution"] == "plain-plugin"
    )
    assert [(h["type"], h["target"]) for h in plugins["plain"]["hooks"]] == [
        ("REPLACE", "tgt.f"),
        ("BEFORE", "launchspec.server_args.ServerArgs.check_server_args"),
    ]
    assert [(h["type"], h["target"]) for h in plugins["vendor"]["hooks"]] == [("REPLACE", "tgt.f")]
    assert srt["conflicts"] == [
        {"target": "tgt.f", "plugins": ["plain", "vendor"], "winner": "vendor"}
    ]
    assert srt["startup_error"] is None
    dplugins = {p["name"]: p for p in diffusion["groups"][DIFF_PLUGINS]}
    assert [(h["type"], h["target"]) for h in dplugins["plain"]["hooks"]] == [("AFTER", "tgt.f")]
    # No diffusion plugin platform: start-up would probe the built-ins, which needs torch; the
    # report names them in order instead.
    assert diffusion["selection"]["key"] is None
    assert diffusion["selection"]["probed"] == ["mps", "xpu", "rocm", "cuda", "npu", "musa", "cpu"]
    assert "pass --probe" in diffusion["selection"]["reason"]

    table = out["table"]
    assert (
        "platform: plugin:vendor -> vendor_pkg.platform.VendorPlatform from vendor-platform"
        in table
    )
    assert "why: SGLANG_PLATFORM=vendor" in table
    rows = {line.split()[0]: line for line in table.splitlines() if line.startswith("    ")}
    assert "not allowed" in rows["off"] and "skipped" in rows["other_extra"]
    assert "loaded" in rows["plain"]
    assert "conflict: 2 REPLACE hooks on tgt.f (plain, vendor); vendor wins" in table
    assert "[sglang.multimodal_gen.plugins]" in table
    assert "platform: a built-in, found by probing at start-up" in table
    assert "SGLANG_PLUGINS does not apply: SGLANG_PLATFORM selects the platform explicitly" in table
    platform_rows = _platform_rows(table)
    assert platform_rows["vendor"] == ["n/a", "selected"] and platform_rows["other"] == ["n/a"]


def _platform_rows(table: str) -> dict:
    """The SRT platform group's table rows: name -> the cells after NAME, DISTRIBUTION, ENTRY POINT."""
    section = table.split(f"[{SRT_PLATFORMS}]")[1].split(f"[{SRT_PLUGINS}]")[0]
    return {line.split()[0]: line.split()[3:] for line in section.splitlines()[2:] if line.strip()}


def _srt_report(monkeypatch, allowlist: str) -> dict:
    """``plugins --runtime srt``'s table and JSON report with ``SGLANG_PLUGINS=allowlist``."""
    monkeypatch.setenv("SGLANG_PLUGINS", allowlist)
    with fresh_plugins():
        _, table = _run("plugins", "--runtime", "srt")
        _, doc = _run("plugins", "--runtime", "srt", "--json")
    return {"table": table, "doc": json.loads(doc)["runtimes"][0]}


@pytest.mark.usefixtures("fresh_process")
def test_platform_rows_say_whether_sglang_plugins_admits_them_to_automatic_selection(
    site, monkeypatch
):
    _site(site)
    some = _srt_report(monkeypatch, "other,plain")
    doc = some["doc"]
    assert doc["platform_allowlist"] == {"variable": "SGLANG_PLUGINS", "applies": True}
    assert {p["name"]: p["allowed"] for p in doc["groups"][SRT_PLATFORMS]} == {
        "other": True,
        "vendor": False,
    }
    rows = _platform_rows(some["table"])
    assert rows == {"other": ["allowed"], "vendor": ["left", "out"]}
    assert "AUTO (SGLANG_PLUGINS)" in some["table"]

    none = _srt_report(monkeypatch, "plain")
    reason = none["doc"]["selection"]["reason"]
    assert reason.startswith(
        "fallback: no platform plugin allowed (SGLANG_PLUGINS=plain leaves out "
    ), reason
    assert "other = other_pkg:activate (from other-platform)" in reason
    assert "vendor = vendor_pkg:activate (from vendor-platform)" in reason
    assert (
        "; add their names to SGLANG_PLUGINS, or unset it, to admit them to automatic selection, or set "
        "SGLANG_PLATFORM to one to select it); start-up probes the built-ins"
    ) in reason
    assert f"why: {reason}" in none["table"]


def _cli(args, site, **env):
    environ = clean_env(**env)
    environ["PYTHONPATH"] = f"{site}:{REPO}"
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=str(REPO),
        timeout=60,
    )


@pytest.mark.e2e  # runs the CLI as its own process
def test_selection_error_is_reported_with_exit_status_1_and_bad_options_are_usage_errors(site):
    _site(site)
    human = _cli(["plugins", "--runtime", "srt"], site, SGLANG_PLATFORM="missing")
    assert human.returncode == 1, human.stderr
    assert "platform: selection fails (SGLANG_PLATFORM=missing)" in human.stdout
    assert "no srt platform plugin named 'missing'" in human.stdout

    doc = _cli(["plugins", "--runtime", "srt", "--json"], site, SGLANG_PLATFORM="missing")
    assert doc.returncode == 1
    report = json.loads(doc.stdout)["runtimes"][0]
    assert "no srt platform plugin named 'missing'" in report["selection"]["error"]
    assert report["startup_error"] == report["selection"]["error"]

    bad = _cli(["plugins", "--format", "xml"], site)
    assert bad.returncode == 2 and "unrecognized arguments: --format" in bad.stderr


@pytest.mark.usefixtures("fresh_process")
def test_reports_the_platform_a_launch_would_serve_on():
    """With nothing installed or set, and no accelerator, a launch serves on the CPU platform; the
    report says so, without probing (the chain as listed) and with ``--probe`` (the selection)."""
    dry, probed = (
        json.dumps(json.loads(_run(*argv)[1]))
        for argv in (
            ["plugins", "--json", "--runtime", "srt"],
            ["plugins", "--json", "--runtime", "srt", "--probe"],
        )
    )
    assert "cpu (a server's stand-in for base)" in dry, dry
    assert '"key": "builtin:cpu"' in probed and "so a server runs on the CPU platform" in probed, (
        probed
    )


def _dual_site(site):
    """``dual``: a platform entry point whose package imports its hooks module, which registers
    with ``@plugin_hook`` at module scope and is also a general-plugin entry point. ``solo``: a
    platform entry point module with a module-scope ``@plugin_hook`` and no plugin entry point."""
    make_dist(site, "tgt-module", modules={"tgt.py": "def f(x):\n    return [x]\n"})
    make_dist(
        site,
        "dual-platform",
        {
            SRT_PLATFORMS: {"dual": "dual_pkg:activate"},
            SRT_PLUGINS: {"dual": "dual_pkg.hooks:register"},
        },
        {
            "dual_pkg/__init__.py": """
                   from dual_pkg import hooks  # noqa: F401 - its decorators run when the platform is activated
                   def activate():
                       return "dual_pkg.platform.DualPlatform"
               """,
            "dual_pkg/platform.py": _platform_module("DualPlatform", "dual"),
            "dual_pkg/hooks.py": """
                   from hooks import HookType, plugin_hook
                   @plugin_hook("tgt:f", type=HookType.AFTER)
                   def dual_after(result, x):
                       return result + ["dual"]
                   def register():
                       pass
               """,
        },
    )
    make_dist(
        site,
        "solo-platform",
        {SRT_PLATFORMS: {"solo": "solo_pkg:activate"}},
        {
            "solo_pkg.py": """
                   from hooks import plugin_hook
                   @plugin_hook("tgt:f")  # AFTER by default
                   def solo_after(result, x):
                       return result + ["solo"]
                   def activate():
                       return None
               """
        },
    )


def _report_then_load(site, plugins_first: bool) -> dict:
    """The SRT report (JSON and table) of a fresh block, then what ``tgt.f(0)`` returns once the
    block has loaded its plugins; ``plugins_first``: the general-plugin loader imports
    ``dual_pkg.hooks`` before the report selects the platform. The modules imported from
    ``site`` are forgotten after, so the next block imports them afresh, as a new process would."""
    with fresh_plugins():
        if plugins_first:
            hooks.register_plugins()  # the general-plugin loader imports dual_pkg.hooks first
        _, doc = _run("plugins", "--runtime", "srt", "--json")
        _, table = _run("plugins", "--runtime", "srt")
        hooks.load_plugins()
        f = importlib.import_module("tgt").f(0)
    forget_modules_from([site])
    return {"doc": json.loads(doc), "table": table, "f": f}


@pytest.mark.usefixtures("fresh_process")
def test_plugins_lists_every_hook_that_will_be_applied_whatever_imported_the_module_first(site):
    _dual_site(site)
    for order in ("selection-first", "plugins-first"):
        res_one = _report_then_load(site, plugins_first=order == "plugins-first")
        srt = res_one["doc"]["runtimes"][0]
        assert srt["selection"]["key"] == "plugin:dual", (order, srt["selection"])
        plugins = {p["name"]: p for p in srt["groups"][SRT_PLUGINS]}
        assert [(h["type"], h["target"], h["hook"]) for h in plugins["dual"]["hooks"]] == [
            ("AFTER", "tgt.f", "dual_pkg.hooks.dual_after")
        ], order
        others = srt["other_hooks"]
        assert [(h["type"], h["target"], h["hook"]) for h in others] == [
            ("AFTER", "tgt.f", "solo_pkg.solo_after")
        ]
        assert (
            "imported by platform entry point solo = solo_pkg:activate (from solo-platform)"
            in others[0]["registered_by"]
        )
        table = res_one["table"]
        assert "dual_pkg.hooks.dual_after" in table and "solo_pkg.solo_after" in table
        assert (
            "solo_pkg.solo_after is of no plugin: module solo_pkg, imported by platform entry point"
            in table
        )
        # What the report lists is what is applied.
        f = res_one["f"]
        assert f[0] == 0 and sorted(f[1:]) == ["dual", "solo"], (order, f)


def test_the_report_imports_no_torch(site):
    """``sglang-launch plugins`` (table and ``--json``) selects the platform and runs the plugins'
    registration without importing torch or the serving runtime's libraries."""
    _site(site)
    res = run_python(
        """
        import contextlib, io, json, sys
        from launcher.cli import main
        codes = []
        for argv in (["plugins"], ["plugins", "--json"]):
            with contextlib.redirect_stdout(io.StringIO()):
                codes.append(main(argv))
        heavy = [m for m in ("torch", "numpy", "transformers", "starlette", "uvicorn") if m in sys.modules]
        print("RESULT:" + json.dumps({"codes": codes, "heavy": heavy}))
    """,
        sites=[site],
        env=clean_env(SGLANG_PLATFORM="vendor", SGLANG_PLUGINS="vendor,plain,other_extra"),
    )
    assert res.returncode == 0, res
    assert res.data == {"codes": [0, 0], "heavy": []}


# A platform plugin whose class a launch refuses (exit 5): what its activate() returns, or what
# its class adds, and a phrase of the error both must name.
BAD_CLASSES = {
    "not importable": ({"activate": "return 'plg_nowhere.platform.Missing'"}, "cannot be imported"),
    "not a subclass": ({"activate": "return 'json.JSONDecoder'"}, "is not a subclass"),
    "a built-in _enum": ({"class_body": "_enum = PlatformEnum.CUDA"}, "not PlatformEnum.OOT"),
    "no _enum member": ({"class_body": "_enum = 'oot'"}, "_enum = 'oot'"),
    "a blank device_name": ({"class_body": "device_name = '  '"}, "device_name"),
    "a raising constructor": (
        {"class_body": "def __init__(self):\n    raise RuntimeError('no device here')"},
        "no device here",
    ),
}


@pytest.mark.e2e  # runs the launch and the report as processes of their own
@pytest.mark.parametrize("case", list(BAD_CLASSES))
def test_plugins_refuses_the_class_a_launch_refuses_with_the_same_error(site, case):
    from support.plugins import platform_plugin

    spec, phrase = BAD_CLASSES[case]
    platform_plugin(site, "bad", **spec)
    launch = _cli(["--port", str(free_port())], site, SGLANG_PLATFORM="bad")
    assert launch.returncode == 5, launch.stderr
    assert phrase in launch.stderr, launch.stderr

    doc = _cli(["plugins", "--runtime", "srt", "--json"], site, SGLANG_PLATFORM="bad")
    assert doc.returncode == 1, doc.stdout + doc.stderr
    report = json.loads(doc.stdout)["runtimes"][0]
    error = report["selection"]["error"]
    assert phrase in error and error.partition(": ")[2] in launch.stderr, (error, launch.stderr)
    assert report["startup_error"] == error
    assert not any(p["selected"] for p in report["groups"][SRT_PLATFORMS]), report

    table = _cli(["plugins", "--runtime", "srt"], site, SGLANG_PLATFORM="bad")
    assert table.returncode == 1 and "platform: selection fails" in table.stdout, table.stdout
    row = next(line for line in table.stdout.splitlines() if line.startswith("    bad "))
    assert not row.rstrip().endswith("selected"), table.stdout


@pytest.mark.e2e  # the stuck activate() is left behind in a process of its own
def test_an_activate_that_hangs_is_reported_as_stuck_after_the_timeout(site):
    from support.plugins import platform_plugin

    platform_plugin(site, "sleepy", activate="import time\ntime.sleep(3600)")
    run = _cli(["plugins", "--runtime", "srt", "--timeout", "1"], site)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "activate() of platform plugin sleepy = plg_sleepy_" in run.stdout, run.stdout
    assert "did not return within 1s" in run.stdout and "--timeout SECONDS" in run.stdout
    assert "Traceback" not in run.stderr, run.stderr


@pytest.mark.usefixtures("fresh_process")
def test_the_report_prints_current_platform_as_the_spec_quick_start_checks_it(site, monkeypatch):
    """Step 6 of the spec's quick start prints ``current_platform`` to verify an install; for a
    plugin written against SGLang's module names (which resolve only where sglang-launch
    installs its aliases) ``sglang-launch plugins`` prints that same line."""
    make_dist(
        site,
        "sglang-written",
        {SRT_PLATFORMS: {"written": "written_pkg:activate"}},
        {
            "written_pkg/__init__.py": (
                "def activate():\n    return 'written_pkg.platform.WrittenPlatform'\n"
            ),
            "written_pkg/device.py": (
                "from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum\n\n"
                "class WrittenDevice(DeviceMixin):\n    _enum = PlatformEnum.OOT\n"
                "    device_name = 'written'\n    device_type = 'cpu'\n"
            ),
            "written_pkg/platform.py": (
                "from sglang.srt.platforms.interface import SRTPlatform\n"
                "from written_pkg.device import WrittenDevice\n\n"
                "class WrittenPlatform(SRTPlatform, WrittenDevice):\n"
                "    def get_default_attention_backend(self):\n        return 'torch_native'\n"
            ),
        },
    )
    monkeypatch.setenv("SGLANG_PLATFORM", "written")
    code, text = _run("plugins", "--runtime", "srt")
    assert code == 0, text
    line = next(ln for ln in text.splitlines() if ln.startswith("  current_platform: "))
    from platforms import current_platform

    assert line == f"  current_platform: {current_platform}"
    assert line.startswith(
        "  current_platform: WrittenPlatform (written_pkg.platform) on device 'cpu' [written]: "
        "srt plugin:written from sglang-written, selected by SGLANG_PLATFORM=written"
    ), line
