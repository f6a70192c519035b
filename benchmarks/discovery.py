"""How much platform selection costs a fresh process, against reading entry points alone.

Run: ``.venv/bin/python benchmarks/discovery.py [--runs N]``

Set-up: the demo platform plugin is pip-installed into a temporary folder, beside six more
platform plugins (real dist-info distributions whose ``activate()`` returns None). Every
measurement is a fresh interpreter; the scenarios run interleaved, ``--runs`` times each:

* baseline  -- ``importlib.metadata.entry_points(group="sglang.srt.platforms")`` only;
* explicit  -- ``SGLANG_PLATFORM=demo``: resolve and construct ``platforms.current_platform``;
* auto      -- the same with automatic discovery (every installed plugin activated; demo wins);
* fallback  -- automatic discovery where no plugin activates, so the built-in chain probes
               CUDA/ROCm/XPU: each probe checks for its driver first and asks torch only when
               the driver is there;
* torch-probe -- the same fallback when the probes ask torch whatever the drivers (how they
               worked before the driver checks): the price of importing torch in the supervisor.

It prints, per scenario, the median time of the operation inside the child and of the whole
child process, the ratios to the baseline (target: explicit at most 1.5x), and how many plugin
modules each scenario imported (explicit selection must import exactly 1); then fallback against
torch-probe (on a machine without accelerator drivers fallback must not import torch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "demo-platform-plugin"
GROUP = "sglang.srt.platforms"
EXTRA_PLUGINS = 6

BASELINE = f"""
import time; t0 = time.perf_counter()
from importlib.metadata import entry_points
eps = entry_points(group={GROUP!r})
elapsed = time.perf_counter() - t0
"""

RESOLVE = """
import time; t0 = time.perf_counter()
from platforms import current_platform
current_platform.device_type
elapsed = time.perf_counter() - t0
"""

TORCH_PROBES = """
import time; t0 = time.perf_counter()
import torch
torch.version.hip is None and torch.cuda.is_available()
getattr(torch, "xpu", None) is not None and torch.xpu.is_available()
from platforms import current_platform
current_platform.device_type
elapsed = time.perf_counter() - t0
"""

REPORT = """
import json, sys
plugin_packages = {plugin_packages!r}
imported = sorted(p for p in plugin_packages if p in sys.modules)
print("BENCH:" + json.dumps(dict(elapsed=elapsed, imported=imported, torch="torch" in sys.modules)))
"""


def build_site(root: Path) -> tuple[Path, list[str]]:
    """pip-install the demo plugin and write the extra plugins; return the site and the plugin
    packages that platform entry points name."""
    site = root / "site"
    source = root / "demo-source"
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
    )
    packages = ["demo_platform_plugin"]
    for i in range(EXTRA_PLUGINS):
        package = f"bench_vendor_{i}"
        info = site / f"bench_vendor_{i}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: bench-vendor-{i}\nVersion: 1.0\n"
        )
        (info / "entry_points.txt").write_text(f"[{GROUP}]\nvendor{i} = {package}:activate\n")
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("def activate():\n    return None\n")
        packages.append(package)
    return site, packages


def run_child(code: str, site: Path, extra_env: dict[str, str]) -> tuple[float, float, dict]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "SGLANG_PLATFORM",
            "SGLANG_PLUGINS",
            "SGLANG_USE_CPU_ENGINE",
            "DEMO_PLATFORM_ENABLE",
        )
    }
    env.update(
        extra_env, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), PYTHONDONTWRITEBYTECODE="1"
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("BENCH:"))
    data = json.loads(line[len("BENCH:") :])
    return data["elapsed"], wall, data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=15, help="fresh processes per scenario (default 15)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-launch-bench-") as tmp:
        site, packages = build_site(Path(tmp))
        report = REPORT.format(plugin_packages=packages)
        scenarios = {
            "baseline": (BASELINE + report, {}),
            "explicit": (
                RESOLVE + report,
                {"SGLANG_PLATFORM": "demo", "DEMO_PLATFORM_ENABLE": "1"},
            ),
            "auto": (RESOLVE + report, {"DEMO_PLATFORM_ENABLE": "1"}),
            "fallback": (RESOLVE + report, {}),
            "torch-probe": (TORCH_PROBES + report, {}),
        }
        inner: dict[str, list[float]] = {name: [] for name in scenarios}
        wall: dict[str, list[float]] = {name: [] for name in scenarios}
        details: dict[str, dict] = {}
        for code, env in scenarios.values():  # warm the page cache once per scenario
            run_child(code, site, env)
        for _ in range(args.runs):
            for name, (code, env) in scenarios.items():
                t_inner, t_wall, data = run_child(code, site, env)
                inner[name].append(t_inner)
                wall[name].append(t_wall)
                details[name] = data

    med_inner = {k: statistics.median(v) for k, v in inner.items()}
    med_wall = {k: statistics.median(v) for k, v in wall.items()}
    print(
        f"platform discovery, fresh processes, median of {args.runs} runs each "
        f"({len(packages)} platform plugins installed; python {sys.version.split()[0]})"
    )
    print(
        f"{'scenario':<11} {'operation ms':>13} {'x baseline':>11} {'process ms':>11} {'x baseline':>11}"
        f"  plugin modules imported  torch imported"
    )
    for name in scenarios:
        print(
            f"{name:<11} {med_inner[name] * 1e3:>13.2f} {med_inner[name] / med_inner['baseline']:>11.2f} "
            f"{med_wall[name] * 1e3:>11.1f} {med_wall[name] / med_wall['baseline']:>11.2f}"
            f"  {len(details[name]['imported']):>23}  {str(details[name]['torch']):>14}"
        )
    explicit_ratio = med_inner["explicit"] / med_inner["baseline"]
    explicit_modules = len(details["explicit"]["imported"])
    print(
        f"explicit selection: {explicit_ratio:.2f}x the entry-point read (target <= 1.5x: "
        f"{'met' if explicit_ratio <= 1.5 else 'NOT met'}); plugin modules imported: {explicit_modules} "
        f"({', '.join(details['explicit']['imported'])}; must be 1: {'met' if explicit_modules == 1 else 'NOT met'})"
    )
    fallback_ratio = med_wall["fallback"] / med_wall["torch-probe"]
    print(
        f"fallback with driver checks: {fallback_ratio:.2f}x the process time of probing through "
        f"torch ({med_wall['fallback'] * 1e3:.0f} vs {med_wall['torch-probe'] * 1e3:.0f} ms); "
        f"torch imported: {details['fallback']['torch']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
