"""``sglang-launch plugins``: the human table and ``--json``, over real installed entry points,
in fresh interpreters; it imports no torch and reports (never raises) selection errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO, clean_env, make_dist, run_python

SRT_PLUGINS = "sglang.srt.plugins"
SRT_PLATFORMS = "sglang.srt.platforms"
DIFF_PLUGINS = "sglang.multimodal_gen.plugins"


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
                      HookRegistry.register("launcher.server_args.ServerArgs.check_server_args",
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


def test_table_and_json_report_every_entry_point_selection_hooks_and_conflicts(site):
    _site(site)
    res = run_python(
        """
        import contextlib, io, json, sys
        from launcher.cli import main
        outputs, codes = [], []
        for argv in (["plugins"], ["plugins", "--json"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                codes.append(main(argv))
            outputs.append(buf.getvalue())
        heavy = [m for m in ("torch", "numpy", "transformers", "starlette", "uvicorn") if m in sys.modules]
        print("RESULT:" + json.dumps({"codes": codes, "table": outputs[0], "doc": json.loads(outputs[1]),
                                       "heavy": heavy, "tgt_imported": "tgt" in sys.modules}))
    """,
        sites=[site],
        env=clean_env(SGLANG_PLATFORM="vendor", SGLANG_PLUGINS="vendor,plain,other_extra"),
    )
    assert res.returncode == 0, res
    out = res.data
    assert out["codes"] == [0, 0]
    assert (
        out["heavy"] == [] and out["tgt_imported"] is False
    )  # no hook applied, no target resolved

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
        ("BEFORE", "launcher.server_args.ServerArgs.check_server_args"),
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


def test_platform_rows_say_whether_sglang_plugins_admits_them_to_automatic_selection(site):
    _site(site)
    code = """
        import contextlib, io, json
        from launcher.cli import main
        outputs = []
        for argv in (["plugins", "--runtime", "srt"], ["plugins", "--runtime", "srt", "--json"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                main(argv)
            outputs.append(buf.getvalue())
        print("RESULT:" + json.dumps({"table": outputs[0], "doc": json.loads(outputs[1])["runtimes"][0]}))
    """
    some = run_python(code, sites=[site], env=clean_env(SGLANG_PLUGINS="other,plain"))
    assert some.returncode == 0, some
    doc = some.data["doc"]
    assert doc["platform_allowlist"] == {"variable": "SGLANG_PLUGINS", "applies": True}
    assert {p["name"]: p["allowed"] for p in doc["groups"][SRT_PLATFORMS]} == {
        "other": True,
        "vendor": False,
    }
    rows = _platform_rows(some.data["table"])
    assert rows == {"other": ["allowed"], "vendor": ["left", "out"]}
    assert "AUTO (SGLANG_PLUGINS)" in some.data["table"]

    none = run_python(code, sites=[site], env=clean_env(SGLANG_PLUGINS="plain"))
    assert none.returncode == 0, none
    reason = none.data["doc"]["selection"]["reason"]
    assert reason.startswith(
        "fallback: no platform plugin allowed (SGLANG_PLUGINS=plain leaves out "
    ), reason
    assert "other = other_pkg:activate (from other-platform)" in reason
    assert "vendor = vendor_pkg:activate (from vendor-platform)" in reason
    assert (
        "; add their names to SGLANG_PLUGINS, or unset it, to admit them to automatic selection, or set "
        "SGLANG_PLATFORM to one to select it); start-up probes the built-ins"
    ) in reason
    assert f"why: {reason}" in none.data["table"]


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


@pytest.mark.e2e  # probes the accelerators (torch) in a fresh interpreter
def test_reports_the_platform_a_launch_would_serve_on():
    """With nothing installed or set, and no accelerator, a launch serves on the CPU platform; the
    report says so, without probing (the chain as listed) and with ``--probe`` (the selection)."""
    res = run_python("""
        import contextlib, io, json
        from launcher.cli import main
        docs = []
        for argv in (["plugins", "--json", "--runtime", "srt"], ["plugins", "--json", "--runtime", "srt", "--probe"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                main(argv)
            docs.append(json.loads(buf.getvalue()))
        print("RESULT:" + json.dumps(docs))
    """)
    assert res.returncode == 0, res
    dry, probed = (json.dumps(doc) for doc in res.data)
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


def test_plugins_lists_every_hook_that_will_be_applied_whatever_imported_the_module_first(site):
    _dual_site(site)
    code = """
        import contextlib, io, json, sys
        import hooks
        if sys.argv[1] == "plugins-first":
            hooks.register_plugins()  # the general-plugin loader imports dual_pkg.hooks first
        from launcher.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main(["plugins", "--runtime", "srt", "--json"])
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            main(["plugins", "--runtime", "srt"])
        hooks.load_plugins()
        import tgt
        print("RESULT:" + json.dumps({"doc": json.loads(buf.getvalue()), "table": table.getvalue(), "f": tgt.f(0)}))
    """
    for order in ("selection-first", "plugins-first"):
        res_one = run_python(code, sites=[site], env=clean_env(), args=[order])
        assert res_one.returncode == 0, res_one
        srt = res_one.data["doc"]["runtimes"][0]
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
        table = res_one.data["table"]
        assert "dual_pkg.hooks.dual_after" in table and "solo_pkg.solo_after" in table
        assert (
            "solo_pkg.solo_after is of no plugin: module solo_pkg, imported by platform entry point"
            in table
        )
        # What the report lists is what is applied.
        f = res_one.data["f"]
        assert f[0] == 0 and sorted(f[1:]) == ["dual", "solo"], (order, f)
