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


def register_packed(module: Any, matmul: Any, model: Any) -> None:
    """Make ``matmul(module, flat)`` the module's computation of a flat input: eager, it is
    called as it is; in a compiled graph, through the opaque op ``packed_linear``
    (``call_packed``), which names the module by its index among ``model``'s registered ones:
    the same model built again numbers its modules the same, so a saved graph serves it."""
    registry: list[Any] = model.__dict__.setdefault("_packed_modules", [])
    module.__dict__["_packed_index"] = len(registry)  # a plain int, not a buffer
    module.__dict__["_packed_matmul"] = matmul
    registry.append(module)


def call_packed(module: Any, flat: torch.Tensor) -> torch.Tensor:
    """A registered module's output for ``flat`` (tokens, in_features)."""
    import torch

    if torch.compiler.is_compiling():  # one opaque call in a compiled graph (``packed_linear``)
        out: torch.Tensor = packed_linear_op()(flat, module._packed_index, module.out_features)
        return out
    result: torch.Tensor = module._packed_matmul(module, flat)
    return result


# The rows of the running compiled step that are its own, the rest being padding (None: every
# row is): set by the compiled step around a call, read by kernels whose cost grows with the rows.
LIVE_ROWS: list[int | None] = [None]

# The packed modules of the model a compiled step is running, by ``_packed_index``: set by the
# compiled step around a call (``packed_modules``), read by the ``packed_linear`` op.
RUNNING: list[list[Any] | None] = [None]
# How many compiled steps have run in this process: what an op's answer may be reused within.
COMPILED_STEPS = [0]
_OP: list[Any] = []


def packed_modules(model: Any) -> list[Any]:
    """``model``'s registered modules, by ``_packed_index`` (``register_packed``)."""
    registry: list[Any] = model.__dict__.get("_packed_modules", [])
    return registry


def packed_linear_op() -> Any:
    """``torch.ops.sglang_launch.packed_linear(x, index, out_features)``, registered once: the
    packed linear ``index`` (its module's ``_packed_index`` in the model the compiled step runs,
    ``RUNNING``) as a custom op, which
    ``torch.compile`` leaves as it is. The op finds the module's packed weight itself: a graph
    never holds oneDNN's opaque weight tensor, which the compiler would turn back into a dense
    one (reordered again at every call)."""
    import torch

    if not _OP:

        @torch.library.custom_op(
            "sglang_launch::packed_linear",
            mutates_args=(),
            schema="(Tensor x, int index, int out_features) -> Tensor",
        )
        def packed_linear(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
            running = RUNNING[0]
            assert running is not None, "packed_linear runs inside a compiled step"
            module: Any = running[index]
            out: torch.Tensor = module._packed_matmul(module, x)
            return out

        @packed_linear.register_fake
        def _(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
            return x.new_empty((x.shape[0], out_features))

        _OP.append(torch.ops.sglang_launch.packed_linear)
    return _OP[0]


def pack_linears(model: Any) -> int:
    """Pack every ``nn.Linear`` of ``model`` (the module docstring), sibling sets that read one
    input as one merged weight (``merged_linear``); how many linears were packed."""
    import types

    import torch

    counts: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        counts[id(param)] = counts.get(id(param), 0) + 1
    from serving.srt.layers.merged_linear import dense_product, merge_siblings, merged_bias

    def merged_product(members: list[Any]) -> Any:
        if len({(m.weight.dtype, m.weight.device) for m in members}) != 1:
            return None
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in members]).contiguous()
        return dense_product(weight, merged_bias(members), pack=True)

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
