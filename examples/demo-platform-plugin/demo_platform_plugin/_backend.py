"""Backend set-up shared by the demo's two platform classes."""

import os

import demo_platform_plugin


def init_backend() -> None:
    """Fail on request (``DEMO_PLATFORM_FAIL_INIT=1``), else record this process's pid and
    register the demo implementation of ``RMSNorm`` for the ``demo`` dispatch key."""
    if os.environ.get("DEMO_PLATFORM_FAIL_INIT", "").strip() == "1":
        raise RuntimeError("demo platform: DEMO_PLATFORM_FAIL_INIT=1")
    from demo_platform_plugin.ops import RMSNorm, rms_norm_demo
    from platforms.custom_op import CustomOp

    CustomOp.register_oot_forward(RMSNorm, fn=rms_norm_demo, platform_key="demo")
    demo_platform_plugin.INIT_CALLS.append(os.getpid())
