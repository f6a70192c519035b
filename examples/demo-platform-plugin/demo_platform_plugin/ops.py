"""A platform-dispatched operation and the demo's own implementation of it, and the demo's
implementation of the diffusion runtime's RMSNorm."""

import os

import torch

from platforms.custom_op import CustomOp


class RMSNorm(CustomOp):
    """Root-mean-square normalisation over the last dimension."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


# How many times the demo implementation ran in this process (observable by tests).
DEMO_FORWARD_CALLS = 0


def rms_norm_demo(op: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The demo device's RMSNorm: the native computation, counted."""
    global DEMO_FORWARD_CALLS
    DEMO_FORWARD_CALLS += 1
    return op.forward_native(x)


# How many times the demo's diffusion RMSNorm ran in this process.
DIFFUSION_RMS_NORM_CALLS = 0


def diffusion_rms_norm_demo(op, x: torch.Tensor) -> torch.Tensor:
    """The demo device's forward for ``platforms.diffusion.layers.RMSNorm``: the native
    computation, counted; the first call in a process appends ``rms_norm <pid>`` to
    ``DEMO_PLATFORM_HOOK_LOG`` (when set), so a test can see the served model used it."""
    global DIFFUSION_RMS_NORM_CALLS
    DIFFUSION_RMS_NORM_CALLS += 1
    if DIFFUSION_RMS_NORM_CALLS == 1 and os.environ.get("DEMO_PLATFORM_HOOK_LOG"):
        with open(os.environ["DEMO_PLATFORM_HOOK_LOG"], "a", encoding="utf-8") as f:
            f.write(f"rms_norm {os.getpid()}\n")
    return op.forward_native(x)
