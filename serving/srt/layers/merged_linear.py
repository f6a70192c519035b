"""Sibling linear layers that read one input, computed as one product (SGLang's ``qkv_proj``
and ``gate_up_proj``).

A transformers attention calls ``q_proj``, ``k_proj`` and ``v_proj`` one after the other on the
same hidden states, and an MLP ``gate_proj`` and ``up_proj`` on the same input. On the CPU each
call is a oneDNN product of a few rows with its own fixed cost, so a decode step of many rows
pays seven of them a layer where two products would do. ``merge_siblings`` gives such a set of
siblings one ``MergedLinear``: the members' weights side by side in one matrix (packed for
oneDNN where the platform packs linears). The model's code is not changed: each member still
answers its own call, with its columns of the merged product.

The contract of a member's call:

- eagerly, the first member called with an input computes the merged product; the others,
  called with the same tensor object, get their columns of it without computing anything. The
  group forgets the product once every member took its columns, or when a member is called with
  another input (or a second time), which computes the product again: the answer is always the
  product of the input given, never a stale one;
- in a compiled graph every member is its own opaque op (``packed_op``), which
  keeps the same contract with the input's memory (address, shape, strides) within one
  compiled step standing for the tensor object, and returns a copy of its columns (a fresh
  tensor, as the compiler expects of an op). PyTorch's inference graphs get no
  common-subexpression pass, so the group has to be the one that computes once. The compiler
  may give siblings two buffers of the same values (it recomputes a cheap input for each
  consumer), and a later step may find either address reused: so a product is never reused
  from another step;
- a weight-only group (``layers.quantization``) computes steps narrower than its ``wide_rows``
  with each member's own weight-only kernel, as an unmerged layer does; only the dense copies of
  the wide steps are merged.

The merged product's columns are the same values the members compute alone for a decode step's
rows (oneDNN's kernel sums each column in the same order); a prompt of hundreds of bfloat16 rows
may differ in the last bit, as the dense copy and the packed weight already may.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from serving.srt.layers.packed_op import COMPILED_STEPS, call_packed, register_packed

if TYPE_CHECKING:
    import torch

# Sibling sets, by the names transformers' models give them (SGLang's stacked parameters).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class MergedLinear:
    """One product for ``members`` (modules of one parent, ``SIBLINGS``): ``wide(flat)``, the
    (tokens, sum of their out_features) product of a flat input, their columns side by side;
    ``narrow(member, flat)``: a member's own kernel for a step of fewer than ``wide_rows`` rows
    (unused when ``wide_rows`` is 0)."""

    def __init__(
        self, members: list[Any], wide: Any, model: Any, *, wide_rows: int = 0, narrow: Any = None
    ):
        self.out_features = sum(int(m.out_features) for m in members)
        self.wide = wide
        self.wide_rows = int(wide_rows)
        self.narrow = narrow
        self.size = len(members)
        self._input: Any = None
        self._product: Any = None
        self._taken: set[int] = set()
        start = 0
        for member in members:
            stop = start + int(member.out_features)
            member.__dict__["_merged"] = self
            member.__dict__["_merged_columns"] = (start, stop)
            member.forward = types.MethodType(_member_forward, member)
            register_packed(member, _member_op, model)
            start = stop

    def product_for(self, member: Any, x: Any, flat: torch.Tensor) -> torch.Tensor:
        """The merged product of ``flat`` for ``member``: computed unless the last computed one
        was of the same input and ``member`` has not taken it yet. ``x``: the input, the tensor
        object (compared by identity) or the key of its memory (a tuple, compared by value)."""
        key = id(member)
        last = self._input
        same = x is last or (isinstance(x, tuple) and isinstance(last, tuple) and x == last)
        if not same or key in self._taken:
            self._input, self._taken = x, set()
            self._product = _product(self, flat)
        product: torch.Tensor = self._product
        self._taken.add(key)
        if len(self._taken) == self.size:  # every member has its columns: let the tensors go
            self._input = self._product = None
        return product


def _product(group: MergedLinear, flat: torch.Tensor) -> torch.Tensor:
    """The group's (tokens, out) product of a wide step (a narrow one is each member's own)."""
    wide: torch.Tensor = group.wide(flat)
    return wide


def _member_forward(module: Any, x: torch.Tensor) -> torch.Tensor:
    import torch

    group: MergedLinear = module.__dict__["_merged"]
    start, stop = module.__dict__["_merged_columns"]
    flat = x.reshape(-1, x.shape[-1])
    if torch.compiler.is_compiling():
        out = call_packed(module, flat)  # ``_member_op``, one opaque op
    elif flat.shape[0] < group.wide_rows:
        out = group.narrow(module, flat)
    else:
        out = group.product_for(module, x, flat)[:, start:stop]
    return out.reshape(*x.shape[:-1], stop - start)


def _member_op(module: Any, flat: torch.Tensor) -> torch.Tensor:
    """A member's columns for ``flat``, as a fresh tensor (a compiled graph's op)."""
    group: MergedLinear = module.__dict__["_merged"]
    if flat.shape[0] < group.wide_rows:
        narrow: torch.Tensor = group.narrow(module, flat)
        return narrow
    start, stop = module.__dict__["_merged_columns"]
    memory = (COMPILED_STEPS[0], flat.data_ptr(), tuple(flat.shape), tuple(flat.stride()))
    return group.product_for(module, memory, flat)[:, start:stop].contiguous()


def merge_siblings(
    model: Any, accept: Any, wide_of: Any, *, wide_rows: int = 0, narrow: Any = None
) -> list[Any]:
    """Give every sibling set of ``model`` whose members all pass ``accept(module)`` and share
    their input width and whether they have a bias one ``MergedLinear``, its product
    ``wide_of(members)`` (None: this set is not merged); the merged members, in order."""
    merged: list[Any] = []
    for parent in model.modules():
        for names in SIBLINGS:
            members = [parent._modules.get(name) for name in names]
            if not all(m is not None and accept(m) for m in members):
                continue
            if (
                len({int(m.in_features) for m in members}) != 1
                or len({m.bias is None for m in members}) != 1
            ):
                continue
            wide = wide_of(members)
            if wide is None:
                continue
            MergedLinear(members, wide, model, wide_rows=wide_rows, narrow=narrow)
            merged.extend(members)
    return merged


def merged_bias(members: list[Any]) -> torch.Tensor | None:
    """The members' biases side by side (None when they have none)."""
    import torch

    if members[0].bias is None:
        return None
    with torch.no_grad():
        return torch.cat([m.bias for m in members]).contiguous()


def packed_product(packed: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """The product of a flat input with a weight in oneDNN's packed layout
    (``linear.pack_weight``), + ``bias``."""
    import torch

    def product(flat: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
        return out

    return product


def dense_product(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """The product of a flat input with the dense (out, in) ``weight``, + ``bias``."""
    import torch

    return lambda flat: torch.nn.functional.linear(flat, weight, bias)
