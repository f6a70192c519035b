"""A GGUF file's quantized tensors laid, as they are, into the weight-only layouts.

Each block of a Q4_0 or Q4_1 tensor is 32 input values of one row with a float16 scale ``d``
(and a float16 minimum ``m`` for Q4_1) and 4-bit values ``q``; it is worth ``d * (q - 8)``
(Q4_0) or ``d * q + m`` (Q4_1), which is the int4 layout's ``(q - 8) * scale + zero`` with
group 32, ``scale = d`` and ``zero = 0`` or ``m + 8 * d``: the file's 4-bit values are the
layer's own, never dequantised. A Q8_0 block is 32 int8 values with a float16 scale; the int8
kernel has one scale per row, so a Q8_0 row is re-scaled to its largest block scale (the block
with that scale keeps its values; the others lose at most half a step of it).

The model directory converted from the file (``serving.srt.gguf_convert``) supplies the rest (the
config, the norms, the embeddings at ``--dtype``) and tells which rows each tensor maps to: a
tensor's rows are matched against the converted layer's weight, as it is or reordered the way
llama.cpp orders the query and key heads, and a tensor that matches neither stays dense.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from serving.srt.layers.quantization import (
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    int4_fits,
    linear_names,
    replace_module,
)

log = logging.getLogger("sglang_launch.gguf_weights")

# GGML type name -> bytes per block of 32 values.
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
LAYOUTS = {
    "Q4_0": "int4 weight-only (group 32, the file's 4-bit values)",
    "Q4_1": "int4 weight-only (group 32, the file's 4-bit values)",
    "Q8_0": "int8 weight-only (the file's 8-bit blocks re-scaled to a scale per row)",
}


def _blocks(data: Any, kind: str) -> dict[str, Any]:
    """The fields of a (rows, blocks x bytes) uint8 array of ``kind`` blocks, as float32 / int."""
    import numpy as np
    import torch

    raw = np.ascontiguousarray(data).reshape(data.shape[0], -1, _BLOCK_BYTES[kind])
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    if kind == "Q8_0":
        return {"d": d, "q": torch.from_numpy(raw[..., 2:].copy().view(np.int8))}
    start = 4 if kind == "Q4_1" else 2
    packed = torch.from_numpy(raw[..., start:].copy())
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # values 0-15, then 16-31 of a block
    fields = {"d": d, "q": q}
    if kind == "Q4_1":
        fields["m"] = torch.from_numpy(
            raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        )
    return fields


def _dequantised(fields: dict[str, Any], kind: str) -> Any:
    """The float32 values of ``fields`` (rows, input): used only to match rows."""
    import torch

    q = fields["q"].to(torch.float32)
    if kind == "Q8_0":
        w = q * fields["d"][..., None]
    elif kind == "Q4_0":
        w = (q - 8.0) * fields["d"][..., None]
    else:
        w = q * fields["d"][..., None] + fields["m"][..., None]
    return w.reshape(w.shape[0], -1)


def _head_order(rows: int, heads: int) -> Any:
    """llama.cpp's query/key row order undone, as an index of rows (transformers' reverse)."""
    import torch

    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def _row_order(fields: dict[str, Any], kind: str, dense: Any, heads: list[int]) -> Any | None:
    """The order of the tensor's rows that gives ``dense`` (None: as they are), or False."""
    import torch

    mine = _dequantised({k: v[:, :2] for k, v in fields.items()}, kind)  # two blocks a row
    target = dense.detach()[:, : mine.shape[1]].to(torch.float32)
    if mine.shape[0] != target.shape[0]:
        return False
    tol = 1e-2 * float(target.abs().max()) + 1e-6
    orders: list[Any] = [None] + [
        _head_order(mine.shape[0], h) for h in heads if h and mine.shape[0] % (2 * h) == 0
    ]
    for order in orders:
        rows = mine if order is None else mine[order]
        if float((rows - target).abs().max()) <= tol:
            return order
    return False


def _layer(fields: dict[str, Any], kind: str, dtype: Any, bias: Any) -> Any:
    import torch

    rows = fields["q"].shape[0]
    if kind == "Q8_0":
        d = fields["d"]  # (rows, blocks)
        q = fields["q"].to(torch.float32)
        peak = (q.abs().amax(dim=-1) * d).amax(dim=-1) / 127.0  # per row
        peak = peak.clamp(min=1e-12)
        rescaled = torch.round(q * (d / peak[:, None])[..., None]).clamp(-127, 127)
        return Int8WeightOnlyLinear(rescaled.to(torch.int8).reshape(rows, -1), peak.to(dtype), bias)
    d = fields["d"]
    zero = torch.zeros_like(d) if kind == "Q4_0" else fields["m"] + 8.0 * d
    return Int4WeightOnlyLinear(fields["q"].reshape(rows, -1), d, zero, 32, dtype, bias)


# GGUF metadata value types: fixed sizes (struct formats); 8 is a string, 9 an array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


class Tensor(NamedTuple):
    """One tensor of a GGUF file: its ggml type name and its bytes, (rows, bytes a row)."""

    kind: str
    data: Any


def read_tensors(path: Path) -> tuple[str, dict[str, Tensor]]:
    """``(architecture, {name: Tensor})`` of a GGUF file, the data memory-mapped. The metadata is
    skipped over, not parsed (the ``gguf`` package's reader parses every array, the vocabulary
    among them, which takes seconds for a large one)."""
    import struct

    import gguf
    import numpy as np

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(raw)  # type: ignore[arg-type]
    pos = 24
    _, _, n_tensors, n_fields = struct.unpack_from("<IIQQ", buf, 0)

    def take(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from("<" + fmt, buf, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return value

    def text() -> str:
        nonlocal pos
        size = take("Q")
        pos += size
        return bytes(buf[pos - size : pos]).decode("utf-8", "replace")

    def skip(kind: int) -> Any:
        nonlocal pos
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind == 8:
            return text()
        item, count = take("I"), take("Q")
        if item in _SCALARS:
            pos += count * struct.calcsize("<" + _SCALARS[item])
        else:
            for _ in range(count):
                skip(item)
        return None

    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = text()
        fields[key] = skip(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = text()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, take("I"), take("Q")))
    align = int(fields.get("general.alignment") or 32)
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, type_id, offset in infos:
        kind = gguf.GGMLQuantizationType(type_id).name
        if kind not in _BLOCK_BYTES:
            continue
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        width = dims[0] // 32 * _BLOCK_BYTES[kind]
        data = raw[start + offset : start + offset + rows * width].reshape(rows, width)
        tensors[name] = Tensor(kind, data)
    return str(fields.get("general.architecture") or ""), tensors


def load_gguf_linears(model: Any, gguf_file: Path, config: Any, dtype: Any) -> Counter[str]:
    """Replace each ``nn.Linear`` of ``model`` whose tensor in ``gguf_file`` is Q4_0, Q4_1 or
    Q8_0 by its weight-only layer of the file's values; how many of each type were laid (and,
    as ``"<type> kept"``, left dequantised because the kernel does not take their shape)."""
    import gguf
    import torch

    arch_name, tensors = read_tensors(gguf_file)
    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        return Counter()
    blocks = int(getattr(config, "num_hidden_layers", 0) or 0)
    names = gguf.get_tensor_name_map(arch, blocks)
    heads = [
        int(getattr(config, "num_attention_heads", 0) or 0),
        int(getattr(config, "num_key_value_heads", 0) or 0),
    ]
    tied = bool(getattr(config, "tie_word_embeddings", False))
    laid: Counter[str] = Counter()
    for name in linear_names(model):
        module = model.get_submodule(name)
        base = names.get_name(name)
        tensor = tensors.get(f"{base}.weight") if base else None
        if tensor is None and tied and base == "output":
            tensor = tensors.get("token_embd.weight")
        if tensor is None:
            continue
        kind = tensor.kind
        if kind != "Q8_0" and not int4_fits(module.in_features, module.out_features, 32):
            laid[f"{kind} kept"] += 1  # its shape is not the kernel's: dequantised, at dtype
            continue
        fields = _blocks(tensor.data, kind)
        with torch.no_grad():
            order = _row_order(fields, kind, module.weight, heads)
        if order is False:
            log.warning(
                "%s: the rows of its GGUF tensor (%s) do not match the model's; kept dense",
                name,
                base,
            )
            continue
        if order is not None:
            fields = {k: v[order] for k, v in fields.items()}
        replace_module(model, name, _layer(fields, kind, dtype, module.bias))
        laid[kind] += 1
    return laid
