"""``check-platform --runtime diffusion``'s workload row, run for real (the check's own spawn child):
one denoising step of a tiny UNet whose norms are the runtime's custom ops, on the CPU platform and
on the pip-installed demo platform; and the row's skip, naming the extra, without diffusers."""

from __future__ import annotations

import pytest
from test_check_platform import check_platform, row

pytestmark = pytest.mark.e2e


def test_workload_row_runs_a_denoising_step_on_cpu_and_on_the_demo_platform(demo_site):
    (cpu, demo), result = check_platform(
        [
            (["--json", "--runtime", "diffusion"], {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "cpu"}),
            (
                ["--json", "--runtime", "diffusion"],
                {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "demo", "DEMO_PLATFORM_ENABLE": "1"},
            ),
        ],
        sites=[demo_site],
        timeout=600,
    )
    on_cpu = row(cpu["report"], "workload.diffusion_step")
    assert on_cpu["status"] == "pass", on_cpu
    assert "1 step + VAE decode on cpu" in on_cpu["detail"]
    assert "GroupNorm x21: forward_native" in on_cpu["detail"]  # the CPU platform's key is native
    on_demo = row(demo["report"], "workload.diffusion_step")
    assert on_demo["status"] == "pass", on_demo
    assert "GroupNorm x21: forward_oot" in on_demo["detail"]  # key "demo": no forward_demo, so oot


HIDE_DIFFUSERS = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "diffusers" or name.startswith("diffusers."):
            raise ModuleNotFoundError("No module named 'diffusers'", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


def test_workload_row_is_skipped_without_diffusers(tmp_path):
    # The check runs in a spawn child, which imports sitecustomize from PYTHONPATH: hide diffusers there.
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_DIFFUSERS)
    (cpu,), result = check_platform(
        [(["--json", "--runtime", "diffusion"], {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "cpu"})],
        sites=[site],
        timeout=600,
    )
    skipped = row(cpu["report"], "workload.diffusion_step")
    assert skipped["status"] == "skipped", skipped
    assert "sglang-launch[diffusion]" in skipped["detail"]
