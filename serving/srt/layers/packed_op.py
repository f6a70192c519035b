"""The opaque op through which a compiled graph calls a layer that computes its own product
(a oneDNN-packed linear, a weight-only layer, a member of merged siblings).

``register_packed`` gives a module its computation of a flat input; ``call_packed`` runs it:
eagerly as it is, in a compiled graph as the custom op ``sglang_launch::packed_linear``, which
``torch.compile`` leaves as it is and which names the module by its index among its model's
registered modules. The compiled step says which model is running (``RUNNING``), how many of
its rows are its own (``LIVE_ROWS``) and counts its calls (``COMPILED_STEPS``) around each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


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
