"""Specialised call wrappers, generated once per hook when hooks are applied.

A hook call must cost little more than the calls it is made of, so nothing here loops over hook
lists or looks anything up per call. For every BEFORE, AFTER or AROUND hook one small function
is compiled from source, with the target's own signature when the target is a plain Python
function (``def f(self, x, *, y=1)`` gets a wrapper ``def f(self, x, *, y=1)``), so no
``*args``/``**kwargs`` packing happens on the way through; the hook and the next callable are
closure cells. Targets without an inspectable signature (builtins, callable objects) get the same
templates over ``*args, **kwargs``.

What hooks receive: the arguments as the target's signature binds them. Positional parameters
arrive positionally (with their defaults when the caller left them out), keyword-only ones by
keyword, and ``*args``/``**kwargs`` as passed. A hook written as ``fn(*args, **kwargs)`` therefore
sees one stable shape however the caller spelled the call.

Layers nest, one per hook: ``BEFORE`` wrappers outermost (first registered runs first), then
``AFTER`` (first registered runs first, each sees the previous result), then ``AROUND`` (last
registered outermost), then the target or its ``REPLACE`` replacement.

For a coroutine function the wrappers are ``async def``: ``AFTER`` hooks get the awaited result,
and a hook that is itself ``async def`` is awaited. A sync ``AROUND`` hook on a coroutine function
may simply return ``original_fn(...)``; the wrapper awaits what it returns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import CodeType, FunctionType
from typing import Any

_PREFIX = "__sgl_"


class Signature:
    """The source text of a parameter list and of the call that forwards it, plus defaults."""

    __slots__ = ("params", "args", "defaults")

    def __init__(self, params: str, args: str, defaults: tuple = ()) -> None:
        self.params = params
        self.args = args
        self.defaults = defaults


GENERIC = Signature("*__sgl_args, **__sgl_kwargs", "*__sgl_args, **__sgl_kwargs")


def signature_of(func: object) -> Signature:
    """The forwarding signature of ``func``: its own for a plain function, else ``GENERIC``.

    Read from the code object (not ``inspect.signature``, which follows ``__wrapped__`` and
    ``__signature__`` and may describe some other function).
    """
    if not isinstance(func, FunctionType):
        return GENERIC
    code: CodeType = func.__code__
    n_pos, n_posonly, n_kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    names = code.co_varnames
    index = n_pos + n_kwonly
    varargs = names[index] if code.co_flags & inspect.CO_VARARGS else None
    index += bool(varargs)
    varkw = names[index] if code.co_flags & inspect.CO_VARKEYWORDS else None
    used = list(names[: n_pos + n_kwonly]) + [n for n in (varargs, varkw) if n]
    if any(name.startswith(_PREFIX) for name in used):
        return GENERIC
    defaults = list(func.__defaults__ or ())
    kwdefaults = func.__kwdefaults__ or {}
    values: list = []
    params: list[str] = []
    args: list[str] = []
    first_default = n_pos - len(defaults)
    for i, name in enumerate(names[:n_pos]):
        if i >= first_default:
            params.append(f"{name}={_PREFIX}d{len(values)}")
            values.append(defaults[i - first_default])
        else:
            params.append(name)
        args.append(name)
        if n_posonly and i == n_posonly - 1:
            params.append("/")
    if varargs:
        params.append(f"*{varargs}")
        args.append(f"*{varargs}")
    elif n_kwonly:
        params.append("*")
    for name in names[n_pos : n_pos + n_kwonly]:
        if name in kwdefaults:
            params.append(f"{name}={_PREFIX}d{len(values)}")
            values.append(kwdefaults[name])
        else:
            params.append(name)
        args.append(f"{name}={name}")
    if varkw:
        params.append(f"**{varkw}")
        args.append(f"**{varkw}")
    return Signature(", ".join(params), ", ".join(args), tuple(values))


def is_async(func: object) -> bool:
    return inspect.iscoroutinefunction(func)


def _call(
    callee: str, args: str, callee_async: bool, in_async: bool, into: str | None
) -> list[str]:
    """Source lines calling ``callee(args)``; the value goes to ``into`` or is returned."""
    expr = f"{callee}({args})"
    if in_async and callee_async:
        expr = f"await {expr}"
    elif in_async:
        # A plain callable in a coroutine wrapper may still hand back an awaitable.
        target = into or f"{_PREFIX}value"
        lines = [
            f"{target} = {expr}",
            f"if {_PREFIX}isawaitable({target}):",
            f"    {target} = await {target}",
        ]
        return lines if into else lines + [f"return {target}"]
    return [f"{into} = {expr}"] if into else [f"return {expr}"]


def _body(
    kind: str, sig_args: str, in_async: bool, hook_async: bool, inner_async: bool
) -> list[str]:
    hook, inner, result = f"{_PREFIX}hook", f"{_PREFIX}inner", f"{_PREFIX}result"
    if kind == "before":
        changed = f"*{_PREFIX}a, **{_PREFIX}k"
        return (
            _call(hook, sig_args, hook_async, in_async, f"{_PREFIX}r")
            + [f"if {_PREFIX}r is None:"]
            + ["    " + line for line in _call(inner, sig_args, inner_async, in_async, None)]
            + [f"{_PREFIX}a, {_PREFIX}k = {_PREFIX}unpack({_PREFIX}r)"]
            + _call(inner, changed, inner_async, in_async, None)
        )
    if kind == "after":
        after_args = f"{result}, {sig_args}" if sig_args else result
        return (
            _call(inner, sig_args, inner_async, in_async, result)
            + _call(hook, after_args, hook_async, in_async, f"{_PREFIX}r")
            + [f"return {result} if {_PREFIX}r is None else {_PREFIX}r"]
        )
    if kind == "around":
        around_args = f"{inner}, {sig_args}" if sig_args else inner
        return _call(hook, around_args, hook_async, in_async, None)
    if kind == "adapt":  # a plain replacement standing in for a coroutine function
        return _call(inner, sig_args, False, in_async, None)
    raise ValueError(f"unknown wrapper kind {kind!r}")


_factories: dict[tuple, FunctionType] = {}


def _factory(
    kind: str, sig: Signature, in_async: bool, hook_async: bool, inner_async: bool
) -> FunctionType:
    key = (kind, sig.params, sig.args, len(sig.defaults), in_async, hook_async, inner_async)
    factory = _factories.get(key)
    if factory is None:
        cells = [f"{_PREFIX}hook", f"{_PREFIX}inner", f"{_PREFIX}unpack", f"{_PREFIX}isawaitable"]
        cells += [f"{_PREFIX}d{i}" for i in range(len(sig.defaults))]
        body = _body(kind, sig.args, in_async, hook_async, inner_async)
        source = "\n".join(
            [f"def {_PREFIX}factory({', '.join(cells)}):"]
            + [f"    {'async ' if in_async else ''}def {_PREFIX}wrapper({sig.params}):"]
            + ["        " + line for line in body]
            + [f"    return {_PREFIX}wrapper"]
        )
        namespace: dict = {}
        exec(compile(source, f"<hook wrapper: {kind}>", "exec"), namespace)  # noqa: S102 - our own template
        factory = _factories[key] = namespace[f"{_PREFIX}factory"]
    return factory


def layer(
    kind: str,
    hook: Callable[..., Any] | None,
    inner: Callable[..., Any],
    sig: Signature,
    in_async: bool,
    unpack: Callable[[Any], tuple[tuple, dict]] | None = None,
) -> Any:
    """One wrapper: ``kind`` is "before", "after", "around" or "adapt"; ``inner`` the callable it
    wraps; ``unpack`` checks a BEFORE hook's ``(args, kwargs)`` (only called when it returns one)."""
    factory = _factory(kind, sig, in_async, is_async(hook), is_async(inner))
    return factory(hook, inner, unpack, inspect.isawaitable, *sig.defaults)


def finish(wrapper: FunctionType, original: object) -> FunctionType:
    """Give the outermost wrapper the original's name, docstring and ``__wrapped__``, and name
    its code after the original so a bad call reads ``f() missing 1 required ...``."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    try:
        wrapper.__dict__.update(getattr(original, "__dict__", {}))
    except (AttributeError, TypeError):
        pass
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    name, qualname = getattr(original, "__name__", None), getattr(original, "__qualname__", None)
    if isinstance(name, str) and isinstance(qualname, str):
        code = wrapper.__code__
        if hasattr(code, "co_qualname"):  # Python >= 3.11
            wrapper.__code__ = code.replace(co_name=name, co_qualname=qualname)
        else:
            wrapper.__code__ = code.replace(co_name=name)
    return wrapper
