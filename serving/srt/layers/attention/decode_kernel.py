"""Decode attention over the KV pool in place, in C (``decode_attention.c``), for the CPU.

``torch_native``'s decode gathers every row's keys and values out of the pool (two copies a
layer) before PyTorch's attention reads them again. The kernel reads each row's slots where they
are, one (row, key/value head) pair per thread at a time: scores, softmax and the weighted sum
in float32, the output in bfloat16. It serves bfloat16 pools without a sliding window, head
sizes that are multiples of 16 up to 256 and at most 16 query heads per key/value head;
anything else, or a machine where the kernel cannot be built (``serving.srt.layers.native``),
keeps PyTorch's path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.srt.layers.native import NativeKernel

if TYPE_CHECKING:
    import torch


def _setup(lib: Any) -> str | None:
    lib.sgl_decode_attention.restype = None
    lib.sgl_decode_attention.argtypes = (
        [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float] + [ctypes.c_long] * 2
    )
    return None


KERNEL = NativeKernel(
    Path(__file__).with_name("decode_attention.c"),
    ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-fopenmp"),
    ("avx512f", "avx512bw", "avx512_bf16"),
    _setup,
)


def fits(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int) -> bool:
    """Whether the kernel serves a decode of ``q`` (rows, heads, dim) over the pool's ``keys``
    and ``values`` buffers (slots, kv_heads, dim) of one layer (``window``: its sliding window,
    negative for none); it is built here on the first call."""
    import torch

    heads, dim = int(q.shape[1]), int(q.shape[2])
    kv_heads, v_dim = int(keys.shape[1]), int(values.shape[2])
    return (
        window < 0
        and q.dtype == keys.dtype == values.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and dim == int(keys.shape[2])
        and dim % 16 == 0
        and v_dim % 16 == 0
        and max(dim, v_dim) <= 256
        and heads % kv_heads == 0
        and heads // kv_heads <= 16
        and keys.stride()[1:] == (dim, 1)
        and values.stride()[1:] == (v_dim, 1)
        and KERNEL.library() is not None
    )


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """(rows, heads, v_dim): row r's query heads attend to its first ``lengths[r]`` slots of
    ``slots`` (rows, width), int64, in the pool's ``keys`` and ``values`` (``fits``)."""
    import torch

    q = q.contiguous()
    rows, heads, dim = q.shape
    kv_heads, v_dim = int(keys.shape[1]), int(values.shape[2])
    out = torch.empty((rows, heads, v_dim), dtype=q.dtype)
    KERNEL.library().sgl_decode_attention(
        q.data_ptr(),
        keys.data_ptr(),
        values.data_ptr(),
        slots.data_ptr(),
        lengths.data_ptr(),
        out.data_ptr(),
        rows,
        heads,
        kv_heads,
        dim,
        v_dim,
        int(slots.shape[1]),
        float(scale),
        keys.stride(0),
        values.stride(0),
    )
    return out
