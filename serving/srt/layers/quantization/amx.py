"""Weight-only products (int4, int8) on the CPU's tile unit (AMX), for steps of many rows.

A decode step of many rows through a weight-only layer has two choices in PyTorch alone: its
weight-only kernel, which turns the weight into floats again for every few rows, or a dense
bfloat16 copy of the weight, two to four times the bytes to read at every step.
``weight_only_amx.c`` does neither: it turns each 16-column block of the weight into bfloat16
once per call, in registers, and multiplies it with every row of the step on the tile unit. The
weight read stays int4 or int8.

``kernel()`` builds the C file with the system's C compiler the first time a process asks
(about a second), into ``<sglang-launch's cache>/kernels/``, and loads it; later starts load
the built file. It is None, and the caller keeps PyTorch's kernels, where the CPU has no
AMX-BF16 (``/proc/cpuinfo``'s ``amx_bf16``, ``amx_tile``, ``avx512_bf16``), the operating
system does not grant the tile state, no C compiler is found, the build fails, or
``SGLANG_LAUNCH_AMX=0`` is set; ``unavailable_reason()`` says which.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("weight_only_amx.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp")
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")
ENV = "SGLANG_LAUNCH_AMX"

_STATE: dict[str, Any] = {}


def kernel() -> Any:
    """The loaded kernel library (``ctypes.CDLL``), or None (the module docstring); decided
    once per process."""
    if "lib" not in _STATE:
        _STATE["lib"], _STATE["why"] = _load()
        if _STATE["lib"] is None:
            log.info("the weight-only AMX kernels are not used: %s", _STATE["why"])
    return _STATE["lib"]


def unavailable_reason() -> str | None:
    """Why ``kernel()`` is None (None when it is not)."""
    kernel()
    why: str | None = _STATE["why"]
    return why


def _load() -> tuple[Any, str | None]:
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{ENV}=0 is set"
    missing = [flag for flag in CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        return None, f"this CPU lacks {', '.join(missing)}"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc or gcc, or $CC) to build it with"
    try:
        path = _built(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"building {SOURCE.name} with {compiler} failed: {exc}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return None, f"loading {path} failed: {exc}"
    if lib.sgl_amx_init() != 0:
        return None, "the operating system did not grant the tile state (arch_prctl)"
    lib.sgl_amx_int4_mm.restype = lib.sgl_amx_int8_mm.restype = None
    lib.sgl_amx_int4_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.sgl_amx_int8_mm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3
    return lib, None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _built(compiler: str) -> Path:
    """The shared library of ``SOURCE``, built unless the cache holds it for this source, these
    flags and this compiler."""
    from launchspec.gguf_cache import cache_root

    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + repr((FLAGS, compiler)).encode()).hexdigest()[:16]
    folder = cache_root() / "kernels"
    path = folder / f"weight_only_amx-{key}.so"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        built = Path(tmp) / path.name
        subprocess.run(
            [compiler, *FLAGS, "-shared", "-fPIC", str(SOURCE), "-o", str(built)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(built, path)  # atomic: a process beside this one loads a whole file or none
    return path


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
