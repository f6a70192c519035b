"""Linear layers of a half-precision model on the CPU through oneDNN's prepacked weights.

PyTorch's plain ``linear`` on a bfloat16 (or float16) CPU tensor reorders the weight into
oneDNN's blocked layout at every call; a generation step calls every linear of the model once,
so that reorder is paid for every weight at every token. ``pack_linears`` does it once: each
``nn.Linear`` of the model keeps its weight in the blocked layout and computes through oneDNN's
``_linear_pointwise`` (the same kernel, the same result). A weight no other module shares (a
tied embedding does) gives its dense memory back.

Applied only where it helps and is safe: a model on the CPU, in bfloat16 or float16, not split
across tensor-parallel ranks, with a PyTorch built with oneDNN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serving.srt.layers.packed_op import call_packed, register_packed

if TYPE_CHECKING:
    import torch

# The batch size oneDNN chooses the blocked layout for: a decode step's rows.
_BATCH_HINT = 16


def can_pack(device: torch.device, dtype: torch.dtype, tp_size: int) -> bool:
    import torch

    return (
        device.type == "cpu"
        and dtype in (torch.bfloat16, torch.float16)
        and tp_size == 1
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A dense (out, in) weight in oneDNN's blocked layout for ``packed_matmul``."""
    import torch

    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT)
    return packed


def packed_matmul(module: Any, flat: torch.Tensor) -> torch.Tensor:
    """``flat @ W.T + bias`` through the module's oneDNN-packed weight ``_packed_weight``."""
    import torch

    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        flat, module._packed_weight, module.bias, "none", [], ""
    )
    return out


def _packed_forward(module: Any, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = call_packed(module, flat)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_linears(model: Any) -> int:
    """Pack every ``nn.Linear`` of ``model`` (the module docstring), sibling sets that read one
    input as one merged weight (``merged_linear``); how many linears were packed."""
    import types

    import torch

    counts: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        counts[id(param)] = counts.get(id(param), 0) + 1
    from serving.srt.layers.merged_linear import merge_siblings, merged_bias, packed_product

    def merged_product(members: list[Any]) -> Any:
        if len({(m.weight.dtype, m.weight.device) for m in members}) != 1:
            return None
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in members]).contiguous()
        return packed_product(pack_weight(weight), merged_bias(members))

    merged = merge_siblings(
        model,
        lambda m: type(m) is torch.nn.Linear and counts.get(id(m.weight), 0) == 1,
        merged_product,
    )
    for module in merged:  # the merged weight holds their values now
        module.weight.data = torch.empty(0, dtype=module.weight.dtype)
    packed = len(merged)
    for module in model.modules():
        if type(module) is not torch.nn.Linear or "_merged" in module.__dict__:
            continue
        weight = module.weight
        module._packed_weight = pack_weight(weight.detach())
        register_packed(module, packed_matmul, model)
        module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
        if counts.get(id(weight), 0) == 1:  # nobody else reads it: its dense copy goes
            weight.data = torch.empty(0, dtype=weight.dtype)
        packed += 1
    return packed
