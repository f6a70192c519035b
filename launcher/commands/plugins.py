"""``sglang-launch plugins``: what is installed, what would activate and why, what hooks what.

For each runtime (SRT and diffusion, or the one ``--runtime`` names) and each of its entry-point
groups: every installed entry point with its distribution; for SRT platforms whether
``SGLANG_PLUGINS`` admits it to automatic selection (it does not apply while ``SGLANG_PLATFORM``
selects explicitly); for general plugins whether ``SGLANG_PLUGINS`` allows it, whether it is skipped as part of an unselected platform, what
happened when it was loaded, and which targets its hooks patch with which types; hooks of no
plugin (registered while something else, such as a platform entry point, imported the module),
with where they come from, since they are applied too; REPLACE conflicts; the platform that would be selected and why, or the error selection would raise.

Producing the report calls platform activation callbacks, constructs the selected platform's class
and calls plugin callbacks, as start-up would (the same calls: a class a launch refuses, one that is
not importable, not its runtime's platform or misnamed, is the report's selection error), but
applies no hook, so nothing of the serving runtime is imported; built-in platforms' hardware probes
(which import torch) run only with ``--probe``, otherwise the report lists the built-ins start-up
would probe, in order. Plugin code that does not return within ``--timeout`` seconds (30) is
reported as stuck, naming it, and the report goes on without it.
Exit status: 0, or 1 when start-up would stop (a selection error, or a failing plugin of the
selected platform's distribution); 2 for a usage error.

``--check`` is a dry run that imports no plugin code: from metadata and source alone
(``launcher.plugin_check``) it says what each plugin would do and what makes it incompatible
here; exit status 1 when a plugin of the platform that would be selected is incompatible.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from launcher.commands.options import QUERY_TIMEOUT, add_launcher_options, seconds
from launchspec.runtimes import SERVING

RUNTIMES = tuple(SERVING)
DEFAULT_TIMEOUT = 30.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch plugins",
        description="List installed platform and general plugins, what would activate and why, "
        "and which targets each plugin's hooks patch.",
    )
    add_launcher_options(
        parser,
        json_help="print one JSON document (for tools)",
        timeout=False,  # its --timeout is the plugin code's, below
        pid_help="the running launcher to ask (implies --running)",
    )
    parser.add_argument(
        "--runtime",
        choices=(*RUNTIMES, "all"),
        default="all",
        help="which runtime to report (default: all)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="probe built-in platforms' hardware now when no plugin decides (imports torch)",
    )
    parser.add_argument(
        "--running",
        action="store_true",
        help="what the workers of a running launcher really have: each worker's platform, "
        "plugins and hooks as it reported them, side by side (with --pid when several run)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long each piece of plugin code the report runs (a platform's activate(), its "
        "class's construction, a plugin's registration callback) may take before it is reported "
        f"as stuck (default: {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="a dry run that imports no plugin code: from metadata and source alone, what each "
        "plugin would do and what makes it incompatible here (exit 1 when a plugin of the "
        "platform that would be selected is)",
    )
    return parser


def _table(rows: list[list[str]], header: list[str], indent: str = "    ") -> list[str]:
    if not rows:
        return [f"{indent}(none installed)"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append(
            indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    return lines


def _render(report: dict[str, Any]) -> list[str]:
    name = report["runtime"]
    sel = report["selection"]
    selector = report["selector"]
    lines = [f"{name.upper()} runtime"]
    setting = (
        f"{selector['variable']}={selector['value']}"
        if selector["value"] is not None
        else f"{selector['variable']} unset"
    )
    if "error" in sel:
        lines.append(f"  platform: selection fails ({setting}): {sel['error']}")
    elif sel["key"] is None:
        lines.append(f"  platform: a built-in, found by probing at start-up ({setting})")
        lines.append(f"            why: {sel['reason']}")
    else:
        origin = f" from {sel['distribution']}" if sel["distribution"] else ""
        lines.append(f"  platform: {sel['key']} -> {sel['qualname']}{origin}")
        lines.append(f"            why: {sel['reason']}")
        lines.append(f"  current_platform: {sel['current_platform']}")
    allow = report["allowlist"]
    lines.append(
        "  SGLANG_PLUGINS: "
        + ("unset (every general plugin is allowed)" if allow is None else ", ".join(allow))
    )
    if report["registration_error"]:
        lines.append(f"  plugin loading fails: {report['registration_error']}")

    (platform_group, platforms), (plugin_group, plugins) = report["groups"].items()
    lines.append(f"  [{platform_group}]")
    header, auto = ["NAME", "DISTRIBUTION", "ENTRY POINT"], report["platform_allowlist"]
    if auto:  # the allowlist's say in automatic selection
        variable = auto["variable"]
        header.append(f"AUTO ({variable})")
        if not auto["applies"]:
            lines.append(
                f"    {variable} does not apply: {selector['variable']} selects the platform explicitly"
            )
    rows = []
    for p in platforms:
        row = [p["name"], p["distribution"] or "?", p["value"]]
        if auto:
            row.append("n/a" if p["allowed"] is None else "allowed" if p["allowed"] else "left out")
        rows.append(row + ["selected" if p["selected"] else ""])
    lines += _table(rows, header + [""])
    lines.append(f"  [{plugin_group}]")
    rows = []
    for p in plugins:
        status = p["status"]
        if p["detail"] and status != "not allowed":
            status = f"{status}: {p['detail']}"
        rows.append(
            [
                p["name"],
                p["distribution"] or "?",
                p["value"],
                "yes" if p["allowed"] else "no",
                "yes" if p["skipped_unselected_platform"] else "no",
                status,
            ]
        )
    lines += _table(
        rows, ["NAME", "DISTRIBUTION", "ENTRY POINT", "ALLOWED", "UNSELECTED PLATFORM", "STATUS"]
    )
    hooks = [[h["type"], h["target"], p["name"], h["hook"]] for p in plugins for h in p["hooks"]]
    hooks += [
        [h["type"], h["target"], "(no plugin)", h["hook"]] for h in report.get("other_hooks", [])
    ]
    if hooks:
        lines.append("  hooks:")
        lines += _table(hooks, ["TYPE", "TARGET", "PLUGIN", "HOOK"])
    for h in report.get("other_hooks", []):
        lines.append(f"  {h['hook']} is of no plugin: {h['registered_by']}")
    for conflict in report["conflicts"]:
        lines.append(
            f"  conflict: {len(conflict['plugins'])} REPLACE hooks on {conflict['target']} "
            f"({', '.join(map(str, conflict['plugins']))}); {conflict['winner']} wins"
        )
    return lines


def _verdict(finding: dict[str, Any]) -> str:
    """A finding's verdict column: INCOMPATIBLE where the plugin would run, the verdict with the
    note where it would not (a skipped plugin's problems never run)."""
    if not finding["incompatible"]:
        return str(finding["verdict"])
    if finding["verdict"] in ("selected", "candidate", "loaded"):
        return "INCOMPATIBLE"
    return f"{finding['verdict']} (incompatible)"


def _render_check(report: dict[str, Any], runtimes: tuple[str, ...]) -> list[str]:
    lines = []
    for block in report["runtimes"]:
        if block["runtime"] not in runtimes:
            continue
        lines.append(f"{block['runtime'].upper()} runtime: {block['selection']}")
        rows = [
            [
                f["kind"],
                f["name"],
                f"{f['distribution']} {f['version'] or ''}".strip(),
                _verdict(f),
                f["why"],
            ]
            for f in block["findings"]
        ]
        lines += _table(rows, ["KIND", "NAME", "DISTRIBUTION", "VERDICT", "WHY"])
        for f in block["findings"]:
            for problem in f["problems"]:
                lines.append(f"    {f['kind']} {f['name']}: incompatible: {problem}")
            for note in f["notes"]:
                lines.append(f"    {f['kind']} {f['name']}: {note}")
        if block["blocking"]:
            lines.append(
                "  start-up would fail or misbehave: the selected platform's "
                + ", ".join(block["blocking"])
                + " incompatible"
            )
        lines.append("")
    lines.append(report["sglang"]["note"])
    return lines


def _side_by_side(manifests: list[dict[str, Any] | None]) -> list[list[str]]:
    """Rows of ``[mark, what, value per worker]``: the platform, each plugin's status and each
    hook's state; ``*`` marks a row whose values differ between the workers."""
    rows: list[list[str]] = []

    def add(label: str, values: list[str]) -> None:
        rows.append(["*" if len(set(values)) > 1 else " ", label, *values])

    def platform(m: dict[str, Any]) -> str:
        return f"{m['platform']['key']} {m['platform']['version'] or ''}".strip()

    add("platform", [platform(m) if m else "-" for m in manifests])
    plugins = {(p["name"], p["distribution"]) for m in manifests if m for p in m["plugins"]}
    for name, dist in sorted(plugins, key=str):
        states = []
        for m in manifests:
            found = [
                p["status"]
                for p in (m or {}).get("plugins", ())
                if (p["name"], p["distribution"]) == (name, dist)
            ]
            states.append(found[0] if found else ("absent" if m else "-"))
        add(f"plugin {name} ({dist})", states)
    keys = {(h["type"], h["target"], h["plugin"]) for m in manifests if m for h in m["hooks"]}
    for kind, target, plugin in sorted(keys, key=str):
        states = []
        for m in manifests:
            found = [
                h["state"] + (f": {h['error']}" if h["error"] else "")
                for h in (m or {}).get("hooks", ())
                if (h["type"], h["target"], h["plugin"]) == (kind, target, plugin)
            ]
            states.append(found[0] if found else ("absent" if m else "-"))
        add(f"{kind} {target} ({plugin or 'no plugin'})", states)
    return rows


def _render_running(workers: list[dict[str, Any]]) -> list[str]:
    """Each worker's manifest side by side, by role (``*``: workers of that role differ)."""
    lines: list[str] = []
    for role in dict.fromkeys(w["role"] for w in workers):
        group = [w for w in workers if w["role"] == role]
        names = [w["name"] for w in group]
        lines.append(f"{role} workers: {', '.join(names)}")
        lines += _table(_side_by_side([w.get("manifest") for w in group]), ["", "WHAT", *names])
        for w in group:
            for difference in w.get("manifest_differs") or []:
                lines.append(f"  {w['name']} differs: {difference}")
        lines.append("")
    return lines


def _running(args: argparse.Namespace) -> int:
    from launcher.query import QueryError, find_launcher, query
    from launcher.supervisor.rundir import NoLauncherError, RuntimeDirError

    try:
        found = find_launcher(args.pid)
        answer = query(found["query_endpoint"], {"query": "snapshot"}, QUERY_TIMEOUT)
    except (NoLauncherError, QueryError, RuntimeDirError) as exc:
        print(f"sglang-launch plugins: {exc}", file=sys.stderr)
        return 1
    snapshot = answer.get("snapshot")
    if not isinstance(snapshot, dict):
        print("sglang-launch plugins: the launcher sent no snapshot", file=sys.stderr)
        return 1
    workers = [w for w in snapshot["workers"] if w.get("manifest") is not None or w.get("ready")]
    if args.json:
        json.dump({"pid": snapshot["pid"], "workers": workers}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(_render_running(workers)).rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.running or args.pid is not None:
        return _running(args)
    if args.check:
        from launcher.plugin_check import check

        names = RUNTIMES if args.runtime == "all" else (args.runtime,)
        report = check()
        report["runtimes"] = [r for r in report["runtimes"] if r["runtime"] in names]
        report["ok"] = not any(r["blocking"] for r in report["runtimes"])
        if args.json:
            json.dump(report, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print("\n".join(_render_check(report, names)))
        return 0 if report["ok"] else 1
    import hooks
    from launcher.prepare import install_aliases

    names = RUNTIMES if args.runtime == "all" else (args.runtime,)
    install_aliases()  # plugins written for SGLang import its names, as in a launch
    for spec in SERVING.values():  # report what a launch would select
        importlib.import_module(spec.platform.platform_module).use_serving_fallback()
    reports = [hooks.describe(name, probe=args.probe, timeout=args.timeout) for name in names]
    if args.json:
        json.dump({"runtimes": reports}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        blocks = ["\n".join(_render(report)) for report in reports]
        print("\n\n".join(blocks))
    return 1 if any(report["startup_error"] for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
