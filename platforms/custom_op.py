"""``CustomOp``: an operation whose implementation is chosen per platform when it is constructed.

Dispatch, decided once in ``__init__`` from the diffusion ``current_platform``'s
``get_dispatch_key_name()`` (set ``runtime = "srt"`` on a subclass to follow SRT's instead):

1. a function registered with ``CustomOp.register_oot_forward(op_cls, fn, platform_key)`` for
   exactly this class and key; it is called as ``fn(op, *args, **kwargs)``;
2. the op's own ``forward_<key>()`` method;
3. ``forward_oot()``, whose default calls ``forward_native()``.

Register implementations from a platform's ``init_backend()``, which runs before operations are
constructed; an op constructed earlier keeps what it chose (stable under compilation). Importing
this module imports torch (``CustomOp`` is an ``nn.Module``); ``import platforms`` does not.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import torch


class CustomOp(torch.nn.Module):
    """Base class of platform-dispatched operations; subclasses implement ``forward_native``."""

    runtime: ClassVar[str] = "diffusion"
    _oot_forwards: ClassVar[dict[tuple[type, str], Callable[..., Any]]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._forward_method = self.dispatch_forward()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    @property
    def forward_method(self) -> Callable[..., Any]:
        """The implementation chosen at construction (a bound method, or the registered
        function as a ``functools.partial`` over this op)."""
        return self._forward_method

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The portable implementation every op must provide."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement forward_native()")

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """What an out-of-tree platform runs when nothing more specific exists."""
        return self.forward_native(*args, **kwargs)

    @classmethod
    def register_oot_forward(cls, op_cls: type, fn: Callable[..., Any], platform_key: str) -> None:
        """Use ``fn(op, *args, **kwargs)`` for ops of exactly ``op_cls`` when the platform's
        dispatch key is ``platform_key``. A later registration for the same pair replaces it."""
        if not (isinstance(op_cls, type) and issubclass(op_cls, CustomOp)):
            raise TypeError(
                f"register_oot_forward: op_cls must be a CustomOp subclass, got {op_cls!r}"
            )
        if not callable(fn):
            raise TypeError(f"register_oot_forward: fn must be callable, got {fn!r}")
        if not isinstance(platform_key, str) or not platform_key.strip():
            raise ValueError(
                f"register_oot_forward: platform_key must be the platform's get_dispatch_key_name() "
                f"value, got {platform_key!r}"
            )
        with CustomOp._registry_lock:
            CustomOp._oot_forwards[(op_cls, platform_key.strip())] = fn

    @classmethod
    def registered_forward(cls, op_cls: type, platform_key: str) -> Callable[..., Any] | None:
        """The function registered for ``(op_cls, platform_key)``, if any."""
        with CustomOp._registry_lock:
            return CustomOp._oot_forwards.get((op_cls, platform_key))

    def dispatch_key(self) -> str:
        """The current platform's ``get_dispatch_key_name()`` for this op's runtime."""
        import importlib

        from platforms.runtimes import runtime_spec

        platforms = importlib.import_module(runtime_spec(self.runtime).platform_module)
        return str(platforms.current_platform.get_dispatch_key_name())

    def dispatch_forward(self) -> Callable[..., Any]:
        """Choose the implementation (see the module docstring for the order)."""
        key = self.dispatch_key()
        fn = self.registered_forward(type(self), key)
        if fn is not None:
            return functools.partial(fn, self)
        method = getattr(self, f"forward_{key}", None) if key.isidentifier() else None
        if callable(method):
            return method
        return self.forward_oot
