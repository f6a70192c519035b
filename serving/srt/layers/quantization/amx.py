"""Weight-only products (int4, int8) on the CPU's tile unit (AMX), for steps of many rows.

A decode step of many rows through a weight-only layer has two choices in PyTorch alone: its
weight-only kernel, which turns the weight into floats again for every few rows, or a dense
bfloat16 copy of the weight, two to four times the bytes to read at every step.
``weight_only_amx.c`` does neither: it turns each 16-column block of the weight into bfloat16
once per call, in registers, and multiplies it with every row of the step on the tile unit. The
weight read stays int4 or int8.

``kernel()`` is the built library (``serving.srt.layers.native``), or None where the CPU has no
AMX-BF16 (``amx_bf16``, ``amx_tile``, ``avx512_bf16``), the operating system does not grant the
tile state, or no kernel can be built; ``unavailable_reason()`` says why. The caller then keeps
PyTorch's kernels.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.srt.layers.native import NativeKernel

if TYPE_CHECKING:
    import torch


def _setup(lib: Any) -> str | None:
    if lib.sgl_amx_init() != 0:
        return "the operating system did not grant the tile state (arch_prctl)"
    lib.sgl_amx_int4_mm.restype = lib.sgl_amx_int8_mm.restype = None
    lib.sgl_amx_int4_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.sgl_amx_int8_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3
    return None


KERNEL = NativeKernel(
    Path(__file__).with_name("weight_only_amx.c"),
    ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp"),
    ("amx_bf16", "amx_tile", "avx512_bf16"),
    _setup,
)


def kernel() -> Any:
    """The loaded kernel library (``ctypes.CDLL``), or None (the module docstring)."""
    return KERNEL.library()


def unavailable_reason() -> str | None:
    """Why ``kernel()`` is None (None when it is not)."""
    return KERNEL.reason()


def fits(in_features: int, out_features: int, group_size: int) -> bool:
    """Whether a (out, in) weight fits the kernels, in groups of ``group_size`` input values
    (int8: ``in_features``, one scale per row)."""
    return out_features % 16 == 0 and group_size % 32 == 0 and in_features % group_size == 0


def int4_layout(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[Any, Any]:
    """``(packed, scale_and_zero)``, the kernel's layouts (``int4_amx.c``) of int4 values ``q``
    (0..15, (out, in)) with ``scale`` and ``zero`` (out, in / group) in bfloat16."""
    import torch

    out, inp = q.shape
    groups = scale.shape[1]
    lanes = q.to(torch.uint8).reshape(out // 16, 16, inp // 2, 2).permute(0, 2, 1, 3)
    lanes = lanes.reshape(out // 16, inp // 2, 32)
    packed = (lanes[..., :16] | (lanes[..., 16:] << 4)).contiguous()
    both = torch.stack(
        [
            scale.reshape(out // 16, 16, groups).transpose(1, 2),
            zero.reshape(out // 16, 16, groups).transpose(1, 2),
        ],
        dim=2,
    )
    return packed, both.to(torch.bfloat16).contiguous()


def int8_layout(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[Any, Any]:
    """``(packed, scales)``, the int8 kernel's layouts (``weight_only_amx.c``) of int8 values
    ``qweight`` ((out, in)) with a bfloat16 scale per row, ``scales`` ((out,))."""
    import torch

    out, inp = qweight.shape
    lanes = qweight.reshape(out // 16, 16, inp // 2, 2).permute(0, 2, 1, 3)
    packed = lanes.reshape(out // 16, inp // 2, 32).contiguous()
    return packed, scales.to(torch.bfloat16).reshape(out // 16, 16).contiguous()


def int8_mm(
    flat: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``flat @ W.T + bias`` for ``flat`` (tokens, in) in bfloat16, W in ``int8_layout``."""
    return _call("sgl_amx_int8_mm", flat, packed, scales, bias)


def int4_mm(
    flat: torch.Tensor,
    packed: torch.Tensor,
    scale_and_zero: torch.Tensor,
    bias: torch.Tensor | None,
    group_size: int,
) -> torch.Tensor:
    """``flat @ W.T + bias`` for ``flat`` (tokens, in) in bfloat16, W in ``int4_layout``."""
    return _call("sgl_amx_int4_mm", flat, packed, scale_and_zero, bias, group_size)


def _call(name: str, flat: Any, packed: Any, scales: Any, bias: Any, *more: int) -> torch.Tensor:
    import torch

    x = flat.contiguous()
    rows, inp = x.shape
    out = packed.shape[0] * 16
    y: torch.Tensor = torch.empty((rows, out), dtype=torch.bfloat16, device=x.device)
    getattr(kernel(), name)(
        x.data_ptr(),
        packed.data_ptr(),
        scales.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
        rows,
        out,
        inp,
        *more,
    )
    return y
