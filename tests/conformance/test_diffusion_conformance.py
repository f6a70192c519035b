"""``check-platform --runtime diffusion``'s workload row, run for real (the check's own spawn child):
without diffusers the row is skipped, naming the extra. Its pass (one denoising step of a tiny UNet
whose norms are the runtime's custom ops) on the CPU platform and on the pip-installed demo
platform is checked by ``test_check_platform``'s CPU and demo tests, on the same command runs."""

from __future__ import annotations

import pytest
from test_check_platform import check_platform, row

pytestmark = pytest.mark.e2e


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
