"""Activation callbacks of the demo platform: import-safe, they only read an environment variable.

The demo device is "available" when ``DEMO_PLATFORM_ENABLE=1``; then each callback returns the
qualified name of its runtime's platform class, otherwise None.
"""

import os

# pids of the processes whose demo init_backend() ran (both runtimes append here).
INIT_CALLS: list = []


def _enabled() -> bool:
    return os.environ.get("DEMO_PLATFORM_ENABLE", "").strip() == "1"


def activate():
    """SRT: ``demo_platform_plugin.platform.DemoSRTPlatform`` when enabled, else None."""
    return "demo_platform_plugin.platform.DemoSRTPlatform" if _enabled() else None


def activate_diffusion():
    """Diffusion: ``demo_platform_plugin.diffusion_platform.DemoDiffusionPlatform`` when enabled."""
    return "demo_platform_plugin.diffusion_platform.DemoDiffusionPlatform" if _enabled() else None
