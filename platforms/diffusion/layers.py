"""The diffusion runtime's normalisation layers as ``platforms.custom_op.CustomOp``s.

``LayerNorm``, ``GroupNorm`` and ``RMSNorm`` compute what ``torch.nn.LayerNorm``,
``torch.nn.GroupNorm`` and diffusers' ``RMSNorm`` compute, from the same parameters, so a denoiser
whose norms are swapped for them (``adopt_custom_ops``) gives the same outputs. Being
``CustomOp``s, each one picks its implementation once, when it is constructed (after the
platform's ``init_backend()``, which the bootstrap runs before this module is imported): a
forward registered with ``CustomOp.register_oot_forward(op_cls, fn, platform_key)``, then
``forward_<key>``, then ``forward_oot``, then ``forward_native``. A plugin registers for these
classes (``platforms.diffusion.layers.RMSNorm`` and so on) from its ``init_backend()``.

Public API for plugin authors (the spec's ``runtime.layers.layernorm``). Importing this module
imports torch; ``import platforms.diffusion`` does not import it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from ..custom_op import CustomOp


class LayerNorm(CustomOp):
    """Layer normalisation over the last ``len(normalized_shape)`` dimensions."""

    def __init__(
        self,
        normalized_shape: tuple[int, ...] | list[int] | int,
        eps: float = 1e-5,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.eps = eps
        self.weight = weight
        self.bias = bias

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(CustomOp):
    """Group normalisation of the channel dimension (dimension 1) in ``num_groups`` groups."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.weight = weight
        self.bias = bias

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class RMSNorm(CustomOp):
    """Root-mean-square normalisation of the last dimension, statistics in float32; the result
    takes the weight's dtype when the weight is half precision, else the product's."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = weight
        self.bias = bias

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        mean_square = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        out = x * torch.rsqrt(mean_square + self.eps)
        if self.weight is None:
            return out.to(input_dtype)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            out = out.to(self.weight.dtype)
        out = out * self.weight
        return out + self.bias if self.bias is not None else out


def _replacement(module: torch.nn.Module) -> CustomOp | None:
    """The ``CustomOp`` computing what ``module`` computes, sharing its parameters, or None."""
    if type(module) is torch.nn.LayerNorm:
        return LayerNorm(module.normalized_shape, module.eps, module.weight, module.bias)
    if type(module) is torch.nn.GroupNorm:
        return GroupNorm(
            module.num_groups, module.num_channels, module.eps, module.weight, module.bias
        )
    if type(module).__name__ == "RMSNorm" and type(module).__module__.startswith("diffusers."):
        found: Any = module  # diffusers' RMSNorm: dim (an int or a shape), eps, weight, bias
        dim = found.dim[-1] if isinstance(found.dim, (tuple, list, torch.Size)) else int(found.dim)
        return RMSNorm(dim, float(found.eps), found.weight, getattr(found, "bias", None))
    return None


def adopt_custom_ops(model: torch.nn.Module) -> int:
    """Swap every LayerNorm, GroupNorm and diffusers RMSNorm inside ``model`` for this module's
    ``CustomOp`` of the same computation (constructed now, so resolved now). Returns the count."""
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            op = _replacement(child)
            if op is not None:
                swaps.append((parent, name, op))
    for parent, name, op in swaps:
        setattr(parent, name, op)
    return len(swaps)


def resolved_forward(op: CustomOp) -> str:
    """How ``op`` resolved: ``registered <module>.<function>`` or the method's name."""
    chosen = op.forward_method
    if isinstance(chosen, functools.partial):
        fn = chosen.func
        return (
            f"registered {getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        )
    return getattr(chosen, "__name__", repr(chosen))


def custom_op_report(model: torch.nn.Module) -> dict[str, dict]:
    """``{op class name: {"count": n, "forward": {resolution: count}}}`` for ``model``'s ops."""
    report: dict[str, dict] = {}
    for module in model.modules():
        if isinstance(module, CustomOp):
            entry = report.setdefault(type(module).__name__, {"count": 0, "forward": {}})
            entry["count"] += 1
            how = resolved_forward(module)
            entry["forward"][how] = entry["forward"].get(how, 0) + 1
    return report
