"""The hook registry: one implementation, one instance per runtime (``hooks.hook_registry`` for
SRT, ``hooks.diffusion`` for diffusion), so a hook registered through one never runs in the other.

Contract of ``Registry``:

* ``register(target, hook, hook_type=AFTER)`` records a hook; it resolves nothing and imports nothing. Only
  ``REPLACE`` accepts a class (``TypeError`` otherwise); a malformed target is a ``ValueError``.
  Registering the same function for the same target, type and plugin again is a no-op.
* ``apply_hooks()`` patches every target that has hooks not applied yet, and only those. It is
  idempotent and incremental: each target is rebuilt from its original with all of its hooks, so
  a hook registered after an apply takes effect at the next one and none is ever applied twice.
  Shallower targets are patched first (a class REPLACE before hooks on its methods).
* One apply round is all or nothing per plugin: when a hook cannot be applied (its target does
  not resolve, is a class for a non-REPLACE hook, is not callable, cannot be set) every patch of
  that round is rolled back, *all* hooks of the plugin that registered it are discarded, and the
  round is retried without them. A best-effort plugin's failure is logged at WARNING with its
  name and traceback; a plugin of the selected platform's distribution (the ``required_policy``
  says which) raises ``PluginError``, after the registry is left consistent. A failing hook
  registered outside any plugin raises ``HookError``.
* Only the named attribute is rebound, never other modules' names for the same object. When a
  module-level target's original is still bound in another imported module, one WARNING names
  those modules (the hooks do not reach callers that use those names).
* Two REPLACE hooks on one target: the one registered last wins; a WARNING names both plugins.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

from . import _wrappers
from ._model import (
    Hook,
    HookError,
    HookType,
    PluginError,
    PluginSource,
    current_plugin_source,
    plugin_source,
)
from ._targets import lookup_raw, parse_target, resolve_owner

__all__ = [
    "Hook",
    "HookError",
    "HookType",
    "PluginError",
    "PluginSource",
    "Registry",
    "current_plugin_source",
    "make_plugin_hook",
    "plugin_source",
]

logger = logging.getLogger("hooks")


@dataclass(eq=False)
class _Patch:
    """One patched attribute: where, what it was, what is installed, which hooks build it."""

    owner: object
    name: str
    original: object  # as stored (a staticmethod object stays one)
    own: bool  # the owner itself held the original (else it was inherited or dynamic)
    installed: object = None
    hooks: list = field(default_factory=list)
    warned: set = field(default_factory=set)

    @property
    def label(self) -> str:
        owner = self.owner
        prefix = getattr(owner, "__name__", None) if isinstance(owner, ModuleType) else None
        if prefix is None and isinstance(owner, type):
            prefix = f"{owner.__module__}.{owner.__qualname__}"
        return f"{prefix or type(owner).__name__}.{self.name}"


class _Failure(Exception):
    """Internal: ``hook`` cannot be applied because of ``error``."""

    def __init__(self, hook: Hook, error: BaseException) -> None:
        super().__init__(str(error))
        self.hook = hook
        self.error = error


def _not_required(source: PluginSource) -> bool:
    return False


def _leave_out(name: str) -> str:
    return f"leave {name!r} out of SGLANG_PLUGINS"


_registries: weakref.WeakSet[Registry] = weakref.WeakSet()


class Registry:
    """A process-local hook registry for one runtime (see the module docstring)."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime
        # Decides whether a failing plugin aborts (True) or is logged and dropped; the plugin
        # loader installs the selected-platform rule here.
        self.required_policy: Callable[[PluginSource], bool] = _not_required
        # How to start without a plugin (the loader's keeps the selected platform).
        self.without_hint: Callable[[str], str] = _leave_out
        self._lock = threading.RLock()
        self._hooks: list[Hook] = []
        self._patches: dict[tuple, _Patch] = {}
        self._dirty: set[tuple] = set()  # patches whose hook set shrank since they were built
        self._failed: list[tuple[Hook, str]] = []  # hooks dropped by a failure, and why
        self._seq = 0
        self._applied = False
        _registries.add(self)

    def __repr__(self) -> str:
        return f"<HookRegistry runtime={self.runtime!r} hooks={len(self._hooks)}>"

    # -- registration -------------------------------------------------------------------------
    def register(
        self, target: str, hook: Callable, hook_type: HookType | str = HookType.AFTER
    ) -> Callable:
        """Register ``hook`` on ``target`` as ``hook_type`` (default ``AFTER``, as in SGLang);
        returns ``hook``. Resolves nothing."""
        hook_type = HookType.coerce(hook_type)
        if isinstance(hook, builtins.type):
            if hook_type is not HookType.REPLACE:
                raise TypeError(
                    f"{hook_type.name} hook on {target!r} is the class {hook.__qualname__}: only "
                    "HookType.REPLACE accepts a class; pass a function for BEFORE/AFTER/AROUND"
                )
        elif not callable(hook):
            raise TypeError(f"hook for {target!r} must be callable, not {hook!r}")
        path = parse_target(target)
        source = current_plugin_source.get()
        with self._lock:
            for known in self._hooks:
                if (
                    known.func is hook
                    and known.type is hook_type
                    and known.source == source
                    and known.path.dotted == path.dotted
                ):
                    return hook
            self._seq += 1
            self._hooks.append(Hook(path, hook, hook_type, source, self._seq))
            if self._applied:
                logger.debug(
                    "%s registered after hooks were applied; it takes effect at the next "
                    "apply_hooks() (or load_plugins() / apply_plugin_hooks())",
                    self._hooks[-1],
                )
        return hook

    def decorator(
        self, target: str, type: HookType | str = HookType.AFTER
    ) -> Callable[[Callable], Callable]:
        """``@plugin_hook(target, type=...)`` (default ``AFTER``): registers the decorated
        function or class and returns it unchanged."""
        HookType.coerce(type)
        parse_target(target)

        def decorate(hook: Callable) -> Callable:
            self.register(target, hook, type)
            return hook

        return decorate

    # -- introspection ------------------------------------------------------------------------
    def hooks(self) -> list[Hook]:
        """Every registered hook, in registration order."""
        with self._lock:
            return list(self._hooks)

    def pending(self) -> list[Hook]:
        """Hooks registered but not applied yet."""
        with self._lock:
            return [h for h in self._hooks if h.location is None]

    def applied(self) -> list[Hook]:
        """Hooks in effect: applied to their target, in registration order."""
        with self._lock:
            return [h for h in self._hooks if h.location is not None]

    def failed(self) -> list[tuple[Hook, str]]:
        """Hooks dropped by a failure (their own, or their plugin's), each with why."""
        with self._lock:
            return list(self._failed)

    def is_applied(self, callback: Callable) -> bool:
        """Whether ``callback`` is a hook applied to its target in this process."""
        with self._lock:
            return any(h.func is callback and h.location is not None for h in self._hooks)

    def records(self) -> list[dict]:
        """Every hook this process registered, as plain data: ``target`` (as applied, after any
        translation of SGLang's names), ``registered_as`` (as written), ``type``, ``hook``,
        ``plugin`` and ``distribution`` (None for a hook of no plugin), ``state`` (applied,
        pending or failed) and ``error`` (why it failed)."""

        def record(hook: Hook, state: str, error: str | None = None) -> dict:
            return {
                "target": hook.path.dotted,
                "registered_as": hook.path.text,
                "type": hook.type.name,
                "hook": hook.name,
                "plugin": hook.source.name if hook.source else None,
                "distribution": hook.source.distribution if hook.source else None,
                "state": state,
                "error": error,
            }

        with self._lock:
            live = [
                record(h, "applied" if h.location is not None else "pending") for h in self._hooks
            ]
            return live + [record(h, "failed", why) for h, why in self._failed]

    def conflicts(self) -> list[dict]:
        """Targets with REPLACE hooks from more than one plugin: who asked and who wins."""
        by_target: dict[str, list[Hook]] = {}
        for hook in self.hooks():
            if hook.type is HookType.REPLACE:
                by_target.setdefault(hook.path.dotted, []).append(hook)
        out = []
        for target, replaces in by_target.items():
            if len({h.source for h in replaces}) > 1:
                names = [h.source.name if h.source else None for h in replaces]
                out.append({"target": target, "plugins": names, "winner": names[-1]})
        return out

    def adopt(self, module: str, source: PluginSource) -> list[Hook]:
        """Attribute to ``source`` the hooks registered outside any plugin by functions (or
        classes) of ``module`` or its submodules; returns them.

        The plugin loader calls it for each plugin it loads: when something else imported the
        plugin's module first (a platform entry point in the same package, the application), the
        module's ``@plugin_hook`` decorators ran then, with no plugin recorded, and importing it
        again runs nothing. Adopting them makes them the plugin's, as a first import would have."""
        prefix = module + "."
        with self._lock:
            adopted = [
                h
                for h in self._hooks
                if h.source is None
                and (home := _defined_in(h.func)) is not None
                and (home == module or home.startswith(prefix))
            ]
            for hook in adopted:
                hook.source = source
            return adopted

    # -- removal ------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """The sequence number of the latest registration (0 before any)."""
        return self._seq

    def discard(
        self, source: PluginSource | None, after: int = 0, because: str | None = None
    ) -> list[Hook]:
        """Forget every hook of ``source`` (registered after sequence number ``after``) and restore
        the targets they patched; returns them. With ``because`` (a failure of the plugin), they
        are remembered as failed, with that reason."""
        with self._lock:
            removed = self._forget(lambda h: h.source == source and h.seq > after)
            if because is not None:
                self._failed.extend((hook, because) for hook in removed)
            if self._dirty:
                self._run_rounds(include_pending=False)
            return removed

    def reset(self) -> None:
        """Restore every patched target and forget all hooks (tests, embedding apps)."""
        with self._lock:
            self._forget(lambda h: True)
            self._failed.clear()
            self._run_rounds(include_pending=False)
            self._applied = False

    def _forget(self, predicate: Callable[[Hook], bool]) -> list[Hook]:
        removed = [h for h in self._hooks if predicate(h)]
        if removed:
            self._hooks = [h for h in self._hooks if not predicate(h)]
            for hook in removed:
                if hook.location is not None:
                    self._patches[hook.location].hooks.remove(hook)
                    self._dirty.add(hook.location)
                    hook.location = None
        return removed

    # -- application --------------------------------------------------------------------------
    def apply_hooks(self) -> None:
        """Patch every target with hooks not applied yet (see the module docstring)."""
        with self._lock:
            self._run_rounds(include_pending=True)
            self._applied = True

    def _run_rounds(self, include_pending: bool) -> None:
        fatal: BaseException | None = None
        while True:
            pending = [h for h in self._hooks if h.location is None] if include_pending else []
            if not pending and not self._dirty:
                break
            try:
                self._round(pending)
            except _Failure as failure:
                error = self._reject(failure)
                fatal = fatal or error
        if fatal is not None:
            raise fatal

    def _reject(self, failure: _Failure) -> BaseException | None:
        """Drop the failing hook's plugin; return the error to raise, if it must abort."""
        hook, error = failure.hook, failure.error
        source = hook.source
        dropped = self._forget(lambda h: h.source == source if source is not None else h is hook)
        message = f"cannot apply {hook}: {type(error).__name__}: {error}"
        for other in dropped:
            why = (
                f"{type(error).__name__}: {error}"
                if other is hook
                else f"discarded with its plugin: {hook.path.dotted} failed to apply"
            )
            self._failed.append((other, why))
        if source is None:
            exc = HookError(message)
        elif self.required_policy(source):
            exc = PluginError(
                f"{message}. {source} ships in the selected platform's distribution, so this "
                f"aborts start-up; fix the hook's target, or start without the plugin: "
                f"{self.without_hint(source.name)}",
                plugin=source.name,
                distribution=source.distribution,
            )
        else:
            logger.warning("%s; all hooks of %s are discarded", message, source, exc_info=error)
            return None
        exc.__cause__ = error
        return exc

    def _round(self, pending: list[Hook]) -> None:
        """Rebuild dirty patches and apply ``pending`` hooks; on a failure undo the whole round."""
        journal: list[tuple] = []  # (owner, name, had own value, previous value), in order
        snapshot = {key: (p, p.installed, list(p.hooks)) for key, p in self._patches.items()}
        fresh: list[_Patch] = []
        try:
            for key in sorted(self._dirty, key=lambda k: k[1]):
                if key in self._patches:
                    self._rebuild(self._patches[key], journal)
            for depth in sorted({h.path.depth for h in pending}):
                touched: dict[tuple, _Patch] = {}
                for hook in (h for h in pending if h.path.depth == depth):
                    patch = self._locate(hook, fresh)
                    touched[(id(patch.owner), patch.name)] = patch
                for patch in touched.values():
                    self._rebuild(patch, journal)
        except _Failure:
            for owner, name, had, previous in reversed(journal):
                _restore(owner, name, had, previous)
            self._patches = {}
            for key, (patch, installed, hooks) in snapshot.items():
                patch.installed, patch.hooks = installed, hooks
                self._patches[key] = patch
            for hook in pending:
                hook.location = None
            raise
        self._dirty.clear()
        self._after_round(fresh)

    def _locate(self, hook: Hook, fresh: list[_Patch]) -> _Patch:
        try:
            owner, name = resolve_owner(hook.path)
            key = (id(owner), name)
            patch = self._patches.get(key)
            if patch is None:
                original, own = lookup_raw(owner, name)
                patch = self._patches[key] = _Patch(owner, name, original, own)
                fresh.append(patch)
        except Exception as exc:  # noqa: BLE001 - any resolution error is this hook's failure
            raise _Failure(hook, exc) from exc
        hook.location = key
        patch.hooks.append(hook)
        return patch

    def _rebuild(self, patch: _Patch, journal: list) -> None:
        owner, name = patch.owner, patch.name
        if patch.installed is not None:
            current, own = lookup_raw(owner, name)
            if current is not patch.installed:
                # Someone rebound the attribute after we patched it: that is the new original.
                patch.original, patch.own = current, own
        hooks = sorted(patch.hooks, key=lambda h: h.seq)
        new = build(patch, hooks) if hooks else None
        had, previous = _current(owner, name)
        journal.append((owner, name, had, previous))
        try:
            if new is None:
                _restore(owner, name, patch.own, patch.original)
            else:
                setattr(owner, name, new)
        except Exception as exc:  # noqa: BLE001 - e.g. a builtin type's attribute
            if not hooks:
                raise
            raise _Failure(hooks[-1], exc) from exc
        if new is None:
            del self._patches[(id(owner), name)]
        else:
            patch.installed = new

    def _after_round(self, fresh: list[_Patch]) -> None:
        for patch in self._patches.values():
            replaces = [h for h in patch.hooks if h.type is HookType.REPLACE]
            sources = tuple(h.source for h in replaces)
            if len(replaces) > 1 and sources not in patch.warned:
                patch.warned.add(sources)
                logger.warning(
                    "%d REPLACE hooks on %s: %s; the last registered wins: %s",
                    len(replaces),
                    patch.label,
                    ", ".join(str(h.source or "no plugin") for h in replaces),
                    replaces[-1],
                )
        _warn_stale_bindings([p for p in fresh if isinstance(p.owner, ModuleType)])


def _defined_in(func: object) -> str | None:
    """The module a hook function or class was defined in (None when it does not say)."""
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    module = getattr(func, "__module__", None)
    return module if isinstance(module, str) else None


def _current(owner: object, name: str) -> tuple[bool, object]:
    namespace: Any = getattr(owner, "__dict__", None)
    try:
        if name in namespace:
            return True, namespace[name]
    except TypeError:
        pass
    return False, None


def _restore(owner: object, name: str, had: bool, value: object) -> None:
    if had:
        setattr(owner, name, value)
    else:
        with contextlib.suppress(AttributeError):
            delattr(owner, name)


def _unpacker(hook: Hook) -> Callable[[object], tuple[tuple, dict]]:
    def unpack(returned: Any) -> tuple[tuple, dict]:
        try:
            args, kwargs = returned
            return tuple(args), dict(kwargs)
        except (TypeError, ValueError):
            raise TypeError(
                f"{hook} returned {returned!r}; a BEFORE hook returns None to keep the arguments "
                "or (args, kwargs) to change them"
            ) from None

    return unpack


def build(patch: _Patch, hooks: list[Hook]) -> object:
    """The object to install for ``hooks`` on ``patch`` (raises ``_Failure`` for a bad hook)."""
    original = patch.original
    replaces = [h for h in hooks if h.type is HookType.REPLACE]
    others = [h for h in hooks if h.type is not HookType.REPLACE]
    if isinstance(original, type):
        if others:
            raise _Failure(
                others[0],
                TypeError(
                    f"{patch.label} is a class; a {others[0].type.name} hook needs a function or "
                    f"method: hook {patch.label}.__init__ (or another method), or REPLACE the class"
                ),
            )
        replacement = replaces[-1].func
        if isinstance(replacement, type) and not issubclass(replacement, original):
            logger.warning(
                "REPLACE of class %s by %s, which does not subclass it: isinstance() and "
                "issubclass() against the original class fail for its instances",
                patch.label,
                replacement.__qualname__,
            )
        return replacement
    rewrap: Any = None  # staticmethod or classmethod, to wrap the result in again
    func: Any = original
    if isinstance(original, (staticmethod, classmethod)):
        rewrap, func = type(original), original.__func__
    if not callable(func):
        culprit = (others or replaces)[0]
        raise _Failure(
            culprit,
            TypeError(
                f"{patch.label} is a {type(original).__name__}, not a function, method or class; "
                "hook a function or method"
            ),
        )
    target_async = _wrappers.is_async(func)
    core = func
    if replaces:
        core = replaces[-1].func
        if isinstance(core, (staticmethod, classmethod)):
            if not others:
                return core
            rewrap, core = type(core), core.__func__
        if not others and not (target_async and not _wrappers.is_async(core)):
            return rewrap(core) if rewrap else core  # bound as is: no wrapper, no extra call
    sig = _wrappers.signature_of(func)
    wrapper = core
    if target_async and not _wrappers.is_async(core):
        wrapper = _wrappers.layer("adapt", None, core, sig, True)
    for hook in (h for h in others if h.type is HookType.AROUND):  # the last registered outermost
        wrapper = _wrappers.layer("around", hook.func, wrapper, sig, target_async)
    for hook in (h for h in others if h.type is HookType.AFTER):
        wrapper = _wrappers.layer("after", hook.func, wrapper, sig, target_async)
    for hook in reversed([h for h in others if h.type is HookType.BEFORE]):
        wrapper = _wrappers.layer("before", hook.func, wrapper, sig, target_async, _unpacker(hook))
    if isinstance(wrapper, FunctionType) and wrapper is not core:
        _wrappers.finish(wrapper, func)
    return rewrap(wrapper) if rewrap else wrapper


def _warn_stale_bindings(patches: list[_Patch]) -> None:
    """One warning per module-level target whose original is still bound in other modules."""
    if not patches:
        return
    wanted = {id(p.original): p for p in patches if callable(p.original)}
    found: dict[int, list[str]] = {}
    for mod_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            items = list(namespace.items())
        except RuntimeError:  # changed size while another thread imports
            continue
        for attr, value in items:
            patch = wanted.get(id(value))
            if patch is not None and value is patch.original and module is not patch.owner:
                found.setdefault(id(value), []).append(f"{mod_name}.{attr}")
    for key, names in found.items():
        patch = wanted[key]
        hook_modules = {getattr(h.func, "__module__", None) for h in patch.hooks}
        names = [n for n in names if n.rsplit(".", 1)[0] not in hook_modules]
        if names:
            logger.warning(
                "hooks on %s (%s) do not reach %s: those modules imported the original before hooks "
                "were applied and keep calling it. Apply hooks before importing them (the bootstrap "
                "does, in workers), or hook the name they use.",
                patch.label,
                ", ".join(str(h.source or "no plugin") for h in patch.hooks),
                ", ".join(names),
            )


def _after_fork_in_child() -> None:
    # A thread that held a registry's lock at fork time does not exist in the child.
    for registry in list(_registries):
        registry._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def make_plugin_hook(registry: Registry) -> Callable[..., Callable[[Callable], Callable]]:
    """The ``plugin_hook(target, type=...)`` decorator of ``registry``."""

    def plugin_hook(
        target: str, type: HookType | str = HookType.AFTER
    ) -> Callable[[Callable], Callable]:
        """Register the decorated function (or, for REPLACE, class) on ``target`` as ``type``
        (default ``AFTER``, as in SGLang); the decorated object is returned unchanged."""
        return registry.decorator(target, type)

    return plugin_hook
