"""Weight-only quantized linear layers on the CPU (SGLang's ``layers/quantization`` room).

Two layouts, each computed by a kernel of PyTorch itself:

- ``Int8WeightOnlyLinear``: int8 weights with one scale per output channel,
  ``torch.ops.aten._weight_int8pack_mm`` (``--torchao-config int8wo``);
- ``Int4WeightOnlyLinear``: int4 weights in groups of ``group_size`` input values, each group
  with a scale and a zero point in the activation dtype, dequantised as
  ``(q - 8) * scale + zero``, ``torch.ops.aten._weight_int4pack_mm_for_cpu``
  (``--torchao-config int4wo-<group>``).

torchao's own configs are not used: its int4 weight-only layout for the CPU is not in the torchao
release that installs beside this torch, and a GGUF file's blocks have to be laid into the layout
here anyway (``serving.srt.model_loader.gguf_weights``). Activations stay in the model's dtype;
only the weights the layer keeps are quantized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serving.srt.layers.linear import pack_weight, packed_matmul
from serving.srt.layers.packed_op import LIVE_ROWS, call_packed, register_packed
from serving.srt.layers.quantization import amx

if TYPE_CHECKING:
    import torch

# How many 16-wide K tiles the int4 kernel packs together (its only supported value on the CPU).
_INNER_K_TILES = 2


def _module_base() -> type:
    import torch

    return torch.nn.Module


class Int8WeightOnlyLinear(_module_base()):  # type: ignore[misc]
    """``y = x @ (qweight * scales[:, None]).T + bias``: ``qweight`` int8 (out, in), ``scales``
    (out,) in the activation dtype."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        import torch

        super().__init__()
        self.in_features = int(qweight.shape[1])
        self.out_features = int(qweight.shape[0])
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.bias = bias
        self.amx: tuple[torch.Tensor, torch.Tensor] | None = None
        if scales.dtype == torch.bfloat16 and amx.fits(self.in_features, self.out_features, 32):
            if amx.kernel() is not None:  # the wide steps' kernel (``keep_wide_copies``)
                self.amx = amx.int8_layout(self.qweight, self.scales)

    def wide_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """The AMX kernel over ``flat`` (tokens, in_features), bias added (``self.amx`` set)."""
        assert self.amx is not None
        return amx.int8_mm(flat, *self.amx, self.bias)

    def narrow_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """The int8 kernel over ``flat`` (tokens, in_features), bias added."""
        import torch

        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
        return out if self.bias is None else out + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _weight_only_forward(self, x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only"


class Int4WeightOnlyLinear(_module_base()):  # type: ignore[misc]
    """int4 weights ``q`` (0..15, (out, in)) in groups of ``group_size`` along the input, a group
    worth ``(q - 8) * scale + zero``; ``scale`` and ``zero`` (out, in / group_size) are stored
    in ``dtype``, the activations' dtype."""

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor,
        group_size: int,
        dtype: torch.dtype,
        bias: torch.Tensor | None,
    ):
        import torch

        super().__init__()
        self.out_features, self.in_features = (int(n) for n in q.shape)
        self.group_size = int(group_size)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.to(torch.int32).contiguous(), _INNER_K_TILES
        )
        both = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scale_and_zero", both)
        self.bias = bias
        self.amx: tuple[torch.Tensor, torch.Tensor] | None = None
        if dtype == torch.bfloat16 and amx.fits(self.in_features, self.out_features, group_size):
            if amx.kernel() is not None:  # the wide steps' kernel (``keep_wide_copies``)
                self.amx = amx.int4_layout(q, scale.to(dtype), zero.to(dtype))

    def wide_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """The AMX kernel over ``flat`` (tokens, in_features), bias added (``self.amx`` set)."""
        assert self.amx is not None
        return amx.int4_mm(flat, *self.amx, self.bias, self.group_size)

    def narrow_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """The int4 kernel over ``flat`` (tokens, in_features), bias added."""
        import torch

        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed, self.group_size, self.scale_and_zero
        )
        return out if self.bias is None else out + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _weight_only_forward(self, x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int4 "
            f"weight-only, group_size={self.group_size}"
        )


WEIGHT_ONLY = (Int8WeightOnlyLinear, Int4WeightOnlyLinear)


def _weight_only_forward(module: Any, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, module.in_features)
    if "_packed_index" in module.__dict__:  # a wide copy is kept (``keep_wide_copies``)
        out = call_packed(module, flat)
    else:
        out = module.narrow_matmul(flat)
    return out.reshape(*x.shape[:-1], module.out_features)


def dense_weight(module: Any) -> torch.Tensor:
    """A weight-only layer's weight as the dense (out, in) matrix its kernel multiplies by, in
    the activations' dtype: the kernel run over the identity, so each value is the kernel's own."""
    import torch

    scales = module.scales if isinstance(module, Int8WeightOnlyLinear) else module.scale_and_zero
    eye = torch.eye(module.in_features, dtype=scales.dtype, device=scales.device)
    saved, module.bias = module.bias, None
    try:
        columns: torch.Tensor = module.narrow_matmul(eye)  # (in, out): row i is column i
    finally:
        module.bias = saved
    return columns.t().contiguous()


def narrow_rows(module: Any, flat: torch.Tensor) -> torch.Tensor:
    """The weight-only kernel's product of ``flat``, the rows of a compiled step's padding
    (``LIVE_ROWS``) left at zero, not computed."""
    live = LIVE_ROWS[0]
    if live is not None and live < flat.shape[0]:
        padded = flat.new_zeros((flat.shape[0], module.out_features))
        padded[:live] = module.narrow_matmul(flat[:live])
        return padded
    narrow: torch.Tensor = module.narrow_matmul(flat)
    return narrow


def _choose_kernel(module: Any, flat: torch.Tensor) -> torch.Tensor:
    import torch

    if flat.shape[0] < module.wide_rows:
        return narrow_rows(module, flat)
    if getattr(module, "amx", None) is not None:
        on_amx: torch.Tensor = module.wide_matmul(flat)
        return on_amx
    if "_packed_weight" in module.__dict__:
        return packed_matmul(module, flat)
    wide: torch.Tensor = torch.nn.functional.linear(flat, module._dense_weight, module.bias)
    return wide


def keep_wide_copies(model: Any, wide_rows: int) -> tuple[int, int]:
    """Give every weight-only layer of ``model`` a way to compute the steps of at least
    ``wide_rows`` tokens; a narrower step keeps the weight-only kernel. An int4 layer in
    bfloat16 uses the AMX kernel (``amx``) over its own int4 values where the CPU has one; any
    other keeps a dense copy of its weight (packed for oneDNN where the platform packs linears:
    ``serving.srt.layers.linear.can_pack``). Sibling sets that read one input share one merged
    product (``merged_linear``). ``(dense copies, on AMX)``: how many layers got each.

    Both compute the values the weight-only kernel multiplies by (``dense_weight``), so every
    path computes the same product up to the order of the additions. What differs is the cost:
    the weight-only kernel reads a quarter (int4) or half (int8) of the bytes, which is what a
    step of a few tokens waits on, but dequantises the weight again for every few rows, which a
    step of many tokens (a prompt, a wide decode) pays many times over; a dense copy reads four
    times the bytes of int4 at every step; the AMX kernel reads the int4 bytes and dequantises
    each once per step."""
    import torch

    from serving.srt.layers.linear import can_pack
    from serving.srt.layers.merged_linear import merge_siblings

    layers = merge_siblings(
        model,
        lambda m: isinstance(m, WEIGHT_ONLY) and "_packed_index" not in m.__dict__,
        _merged_wide_product,
        wide_rows=wide_rows,
        narrow=narrow_rows,
    )
    for module in model.modules():
        if (
            not isinstance(module, WEIGHT_ONLY)
            or "_packed_index" in module.__dict__
            or "_merged" in module.__dict__
        ):
            continue
        if getattr(module, "amx", None) is None:  # the AMX kernel needs no copy
            with torch.no_grad():
                dense = dense_weight(module)
                if can_pack(dense.device, dense.dtype, 1):
                    module._packed_weight = pack_weight(dense)
                else:
                    module._dense_weight = dense
        module.wide_rows = int(wide_rows)
        register_packed(module, _choose_kernel, model)
        layers.append(module)
    on_amx = sum(1 for module in layers if getattr(module, "amx", None) is not None)
    return len(layers) - on_amx, on_amx


def _merged_wide_product(members: list[Any]) -> Any:
    """The wide steps' product of merged weight-only siblings: the AMX kernel over their blocks
    one after the other where each has them (one kind, one group size), else one dense copy."""
    import torch

    from serving.srt.layers.linear import can_pack
    from serving.srt.layers.merged_linear import dense_product, merged_bias, packed_product

    bias = merged_bias(members)
    layouts = [m.amx for m in members]
    kinds = {(type(m), getattr(m, "group_size", None)) for m in members}
    if all(layout is not None for layout in layouts) and len(kinds) == 1:
        packed = torch.cat([layout[0] for layout in layouts]).contiguous()
        scales = torch.cat([layout[1] for layout in layouts]).contiguous()
        if isinstance(members[0], Int8WeightOnlyLinear):
            return lambda flat: amx.int8_mm(flat, packed, scales, bias)
        group = members[0].group_size
        return lambda flat: amx.int4_mm(flat, packed, scales, bias, group)
    for member in members:  # a dense copy serves them all: their AMX layouts go unused
        member.amx = None
    with torch.no_grad():
        dense = torch.cat([dense_weight(m) for m in members]).contiguous()
    if can_pack(dense.device, dense.dtype, 1):
        return packed_product(pack_weight(dense), bias)
    return dense_product(dense, bias)


def int4_fits(in_features: int, out_features: int, group_size: int) -> bool:
    """Whether a (out, in) weight fits the int4 kernel with ``group_size``."""
    return (
        in_features % group_size == 0
        and in_features % (16 * _INNER_K_TILES) == 0
        and out_features % 16 == 0
    )


def int8_from_float(weight: torch.Tensor, dtype: torch.dtype) -> tuple[Any, Any]:
    """``(qweight, scales)`` of a float (out, in) weight: symmetric, a scale per output channel."""
    import torch

    w = weight.detach().to(torch.float32)
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(dtype)


def int4_from_float(weight: torch.Tensor, group_size: int) -> tuple[Any, Any, Any]:
    """``(q, scale, zero)`` of a float (out, in) weight: asymmetric, per group of
    ``group_size`` input values (the group's minimum and maximum span the 16 levels)."""
    import torch

    w = weight.detach().to(torch.float32)
    out, inp = w.shape
    groups = w.reshape(out, inp // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15.0).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.reshape(out, inp).to(torch.int32), scale, low + 8.0 * scale


def quantize_linear(module: Any, method: str, group_size: int | None, dtype: Any) -> Any:
    """The weight-only layer of ``method`` (``int8wo`` / ``int4wo``) for an ``nn.Linear``, or
    None when its shape does not fit the kernel (it stays as it is)."""
    bias = module.bias
    if method == "int8wo":
        return Int8WeightOnlyLinear(*int8_from_float(module.weight, dtype), bias)
    assert group_size is not None
    if not int4_fits(module.in_features, module.out_features, group_size):
        return None
    q, scale, zero = int4_from_float(module.weight, group_size)
    return Int4WeightOnlyLinear(q, scale, zero, group_size, dtype, bias)


def replace_module(model: Any, name: str, new: Any) -> None:
    """Put ``new`` where ``model``'s submodule ``name`` is."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def linear_names(model: Any) -> list[str]:
    """The names of every plain ``nn.Linear`` of ``model`` (tied heads included)."""
    import torch

    return [
        name
        for name, module in model.named_modules(remove_duplicate=False)
        if type(module) is torch.nn.Linear
    ]
