"""The platform chooses the KV memory classes, as SGLang's core lets it.

``memory_classes(platform, page_size)`` returns the token-to-KV pool class and the allocator
class a launch uses:

- the pool: ``platform.get_kv_pool_cls(kind="mha")`` where the platform has that method (SGLang's
  newer name), else ``platform.get_mha_kv_pool_cls()`` (the contract's); None or
  ``NotImplementedError`` from either means this project's ``MHATokenToKVPool``;
- the allocator: at ``page_size`` > 1, ``platform.get_paged_allocator_cls()`` (None or
  ``NotImplementedError``: this project's ``PagedTokenToKVPoolAllocator``); at ``page_size`` 1,
  ``TokenToKVPoolAllocator`` (SGLang asks the platform for its paged allocator only).

A class named as SGLang's stock class (``sglang.srt.mem_cache.memory_pool.MHATokenToKVPool``,
``sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator``; both real vendor plugins return
exactly these) is this project's class: through the aliases (``launchspec.compat``) the import
already gives it, and where a real ``sglang`` is installed, the name is translated by the same
table. Anything else must be a subclass of the base (``MHATokenToKVPool``,
``BaseTokenToKVPoolAllocator``), or ``PlatformClassUnusable`` (a ``SetupFailure``: the launch
stops with exit 5) names the platform's class, the method and what it returned.

``build_memory(platform, ...)`` constructs both with SGLang's constructor parameters; a platform
class that fails to construct raises ``PlatformClassUnusable`` too (this project's own classes'
errors pass through unchanged: they are not the platform's fault).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NamedTuple

from launchspec.causes import SetupFailure
from serving.srt.mem_cache.allocator import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from serving.srt.mem_cache.memory_pool import MHATokenToKVPool

if TYPE_CHECKING:
    import torch

POOL_METHODS = ("get_kv_pool_cls", "get_mha_kv_pool_cls")
ALLOCATOR_METHOD = "get_paged_allocator_cls"


class PlatformClassUnusable(SetupFailure):
    """A platform method's class cannot be used (the module docstring): it returned something
    that is not a subclass of the base, a class that does not construct, or it raised.
    ``platform``: the platform's dotted class name; ``method``: the method, as called;
    ``problem``: what went wrong, in words."""

    def __init__(self, platform: object, method: str, problem: str) -> None:
        self.platform = _dotted(type(_real(platform, method)))
        self.method = method
        self.problem = problem
        super().__init__(
            f"{self.platform}.{method} {problem}",
            hint=f"make {method} return SGLang's class or a subclass of it, or select another "
            "platform with SGLANG_PLATFORM",
        )


class Chosen(NamedTuple):
    """One class a launch uses: ``cls``; ``method``, the platform method that chose it, as
    called (None: nobody did, this project's default); ``value``, what that method returned."""

    cls: type
    method: str | None
    value: object


def sglang_names() -> None:
    """Make SGLang's module names resolve in this process, as they do in every worker (the
    bootstrap installs the alias table there), before a platform is asked for a class it may
    import by those names: also where the runtime runs in a process of its own (a test, an
    offline script)."""
    from hooks.compat import install, installed
    from launchspec.compat import TABLE

    if installed() is None:
        install(TABLE)


def pool_class(platform: object) -> Chosen:
    """The token-to-KV pool class of ``platform`` (the module docstring)."""
    sglang_names()
    for name in POOL_METHODS:
        method = getattr(platform, name, None)
        if method is None:
            continue
        called = f'{name}(kind="mha")' if name == "get_kv_pool_cls" else f"{name}()"
        try:
            value = method(kind="mha") if name == "get_kv_pool_cls" else method()
        except NotImplementedError:
            continue
        except Exception as exc:
            raise _raised(platform, called, exc) from exc
        if value is None:
            continue
        return Chosen(_checked(platform, called, value, MHATokenToKVPool), called, value)
    return Chosen(MHATokenToKVPool, None, None)


def paged_allocator_class(platform: object) -> Chosen:
    """The paged allocator class of ``platform`` (the module docstring)."""
    sglang_names()
    method = getattr(platform, ALLOCATOR_METHOD, None)
    if method is not None:
        called = f"{ALLOCATOR_METHOD}()"
        try:
            value = method()
        except NotImplementedError:
            value = None
        except Exception as exc:
            raise _raised(platform, called, exc) from exc
        if value is not None:
            base = BaseTokenToKVPoolAllocator
            return Chosen(_checked(platform, called, value, base), called, value)
    return Chosen(PagedTokenToKVPoolAllocator, None, None)


def memory_classes(platform: object, page_size: int) -> tuple[type, type]:
    """``(pool_cls, allocator_cls)`` a launch with ``page_size`` uses on ``platform``."""
    allocator = paged_allocator_class(platform).cls if page_size > 1 else TokenToKVPoolAllocator
    return pool_class(platform).cls, allocator


def build_memory(
    platform: object,
    *,
    size: int,
    page_size: int,
    dtype: torch.dtype,
    head_num: int,
    head_dim: int,
    layer_num: int,
    device: str | torch.device,
    start_layer: int | None = None,
    end_layer: int | None = None,
    need_sort: bool = False,
    **pool_kwargs: Any,
) -> tuple[MHATokenToKVPool, BaseTokenToKVPoolAllocator]:
    """The KV pool (``size`` slots) and its allocator, of the classes ``platform`` chooses,
    constructed as SGLang's core constructs them. ``pool_kwargs`` go to the pool (``v_head_dim``,
    ...). ``PlatformClassUnusable`` when a platform class is unusable or does not construct."""
    if page_size > 1:
        allocator_choice = paged_allocator_class(platform)
    else:
        allocator_choice = Chosen(TokenToKVPoolAllocator, None, None)
    kv_pool = _construct_pool(
        platform,
        pool_class(platform),
        size,
        page_size=page_size,
        dtype=dtype,
        head_num=head_num,
        head_dim=head_dim,
        layer_num=layer_num,
        device=device,
        enable_memory_saver=False,
        start_layer=start_layer,
        end_layer=end_layer,
        **pool_kwargs,
    )
    allocator = _construct_allocator(
        platform, allocator_choice, size, page_size, dtype, device, kv_pool, need_sort
    )
    return kv_pool, allocator


def check_factory(platform: object, method: str, device: str | torch.device = "cpu") -> str:
    """What a launch does with ``platform``'s ``method`` (``get_mha_kv_pool_cls`` or
    ``get_paged_allocator_cls``), in words, after constructing a small instance of the class on
    ``device``; ``PlatformClassUnusable`` where a launch would stop, ``NotImplementedError`` as
    the method raises it (a launch uses this project's class)."""
    import torch

    called = f"{method}()"
    try:
        value = getattr(platform, method)()
    except NotImplementedError:
        raise
    except Exception as exc:
        raise _raised(platform, called, exc) from exc
    ours = MHATokenToKVPool if method != ALLOCATOR_METHOD else PagedTokenToKVPoolAllocator
    if value is None:
        return f"None: a launch uses {_dotted(ours)}"
    base = MHATokenToKVPool if method != ALLOCATOR_METHOD else BaseTokenToKVPoolAllocator
    choice = Chosen(_checked(platform, called, value, base), called, value)
    if method != ALLOCATOR_METHOD:
        pool_choice, page_size = choice, 1
    else:
        pool_choice, page_size = Chosen(MHATokenToKVPool, None, None), 4
    kv_pool = _construct_pool(
        platform,
        pool_choice,
        16,
        page_size=page_size,
        dtype=torch.float32,
        head_num=1,
        head_dim=4,
        layer_num=1,
        device=device,
        enable_memory_saver=False,
        start_layer=None,
        end_layer=None,
    )
    if method == ALLOCATOR_METHOD:
        _construct_allocator(platform, choice, 16, page_size, torch.float32, device, kv_pool, False)
    named = _dotted(value) if isinstance(value, type) else repr(value)
    resolved = "" if choice.cls is value else f" (SGLang's stock class: {_dotted(choice.cls)})"
    when = " at --page-size > 1" if method == ALLOCATOR_METHOD else ""
    return f"{named}{resolved}: a launch uses it{when}; it constructs with SGLang's parameters"


def _construct_pool(platform: object, choice: Chosen, size: int, **kwargs: Any) -> Any:
    try:
        return choice.cls(size, **kwargs)
    except Exception as exc:
        raise _construct_error(platform, choice, exc) from exc


def _construct_allocator(
    platform: object,
    choice: Chosen,
    size: int,
    page_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    kv_pool: Any,
    need_sort: bool,
) -> Any:
    try:
        if page_size > 1:
            return choice.cls(
                size,
                page_size=page_size,
                dtype=dtype,
                device=device,
                kvcache=kv_pool,
                need_sort=need_sort,
            )
        return choice.cls(size, dtype=dtype, device=device, kvcache=kv_pool, need_sort=need_sort)
    except Exception as exc:
        raise _construct_error(platform, choice, exc) from exc


def _construct_error(platform: object, choice: Chosen, exc: Exception) -> Exception:
    if choice.method is None or choice.cls in _STOCK.values():
        return exc  # this project's class: not the platform's fault, the error as it is
    return PlatformClassUnusable(
        platform,
        choice.method,
        f"returned {_dotted(choice.cls)}, which failed to construct with SGLang's parameters: "
        f"{type(exc).__name__}: {exc}",
    )


def _real(platform: object, method: str) -> object:
    """The platform instance itself, behind ``current_platform``'s lazy proxy: the object its
    ``method`` is bound to."""
    bound = getattr(platform, method.partition("(")[0], None)
    return getattr(bound, "__self__", platform)


def _raised(platform: object, method: str, exc: Exception) -> PlatformClassUnusable:
    return PlatformClassUnusable(platform, method, f"raised {type(exc).__name__}: {exc}")


# SGLang's stock classes, by SGLang's dotted name -> this project's class.
_STOCK: dict[str, type] = {
    "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool": MHATokenToKVPool,
    "sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator": PagedTokenToKVPoolAllocator,
    "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator": (
        PagedTokenToKVPoolAllocator
    ),
    "sglang.srt.mem_cache.allocator.TokenToKVPoolAllocator": TokenToKVPoolAllocator,
    "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator": TokenToKVPoolAllocator,
}


def _checked(platform: object, method: str, value: object, base: type) -> type:
    if not isinstance(value, type):
        raise PlatformClassUnusable(
            platform,
            method,
            f"returned {value!r}, which is not a class (a launch needs a subclass of "
            f"{_dotted(base)})",
        )
    if issubclass(value, base):
        return value
    ours = _stock(value)
    if ours is not None and issubclass(ours, base):
        return ours
    raise PlatformClassUnusable(
        platform,
        method,
        f"returned {_dotted(value)}, which is not a subclass of {_dotted(base)} (SGLang's "
        f"{_dotted(base).replace('serving.srt.', 'sglang.srt.')}, the base a launch needs)",
    )


def _stock(cls: type) -> type | None:
    """This project's class for SGLang's stock class ``cls``, by its dotted name (a real
    ``sglang``'s, where one is installed): the alias table translates it."""
    name = _dotted(cls)
    if name in _STOCK:
        return _STOCK[name]
    from hooks.compat import translate_name
    from launchspec.compat import TABLE

    ours = translate_name(name, TABLE)
    if ours is None or ours == name:
        return None
    module, _, attr = ours.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
    return found if found in _STOCK.values() else None


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
