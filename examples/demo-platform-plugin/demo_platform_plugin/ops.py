"""A platform-dispatched operation and the demo's own implementation of it."""

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
