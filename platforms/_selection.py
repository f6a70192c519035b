"""The one platform-selection algorithm, run over a ``RuntimeSpec``.

``resolve(spec, environ, pinned)`` decides *which* platform a process uses and returns a
``Selection``; ``instantiate(spec, selection)`` imports and constructs it. They are apart so that
a supervisor can learn the selection (and hand its ``key`` to children) without importing the
platform class. The rules, in order:

1. a pinned key (``pin_selection``): exactly that platform, a built-in without probing;
2. the runtime's selector variable: a built-in alias the runtime accepts directly, or exactly
   one entry point of that name, of which only that callback is imported and called;
3. automatic discovery: every entry point of the group (narrowed by the runtime's allowlist
   variable) is activated; one active plugin wins, several are an error, a raising callback
   aborts (it never falls back);
4. the runtime's built-in chain, first available wins.

``resolve(..., probe=False)`` stops before the first built-in whose availability needs a hardware
probe (probes import torch) and raises ``ProbeRequired`` naming the built-ins start-up would
probe; ``sglang-launch plugins`` reports that without ``--probe``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import entrypoints
from .entrypoints import EntryPoint
from .runtimes import Builtin, RuntimeSpec


def _log(level: str, message: str, *args: object) -> None:
    import logging  # imported on use: it costs a fresh process more than the selection itself

    getattr(logging.getLogger("platforms"), level)(message, *args)


PLUGIN_PREFIX = "plugin:"
BUILTIN_PREFIX = "builtin:"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class PlatformSelectionError(RuntimeError):
    """Platform selection failed; the message says what was found and what to set.

    The common base of every selection error. Where SGLang raises a ``ValueError``, a
    ``TypeError`` or lets a plugin's own ``ImportError`` through, the error raised here is also an
    instance of that type (``PlatformValueError``, ``PlatformTypeError``, ``PlatformImportError``,
    ``PlatformAttributeError``), so plugin code written against SGLang catches it unchanged.
    """


class PlatformValueError(PlatformSelectionError, ValueError):
    """A value selection read is wrong (a selector variable that is not a boolean), or a selector
    names no installed platform (``PlatformNotFoundError``)."""


class PlatformNotFoundError(PlatformValueError):
    """The selector variable (or a pinned key) names no installed platform plugin."""


class PlatformTypeError(PlatformSelectionError, TypeError):
    """A plugin gave selection something of the wrong kind: an entry point that is no function,
    an ``activate()`` result that is no class name, a class that is not its runtime's platform
    (base class, ``_enum``, device names); or the plugin's code raised a ``TypeError``."""


class PlatformImportError(PlatformSelectionError, ImportError):
    """A plugin's module or platform class cannot be imported (``name`` and ``path`` are the
    original ``ImportError``'s)."""


class PlatformAttributeError(PlatformSelectionError, AttributeError):
    """The class a plugin selected does not exist in its module."""


# The built-in type a plugin's own exception is checked against, in order, and the selection
# error that is also one.
_LIKE: tuple[tuple[type[BaseException], type[PlatformSelectionError]], ...] = (
    (ImportError, PlatformImportError),
    (AttributeError, PlatformAttributeError),
    (TypeError, PlatformTypeError),
    (ValueError, PlatformValueError),
)


def selection_error(message: str, cause: BaseException | None = None) -> PlatformSelectionError:
    """A ``PlatformSelectionError`` saying ``message``; when ``cause`` (what a plugin's code raised)
    is an ``ImportError``, ``AttributeError``, ``TypeError`` or ``ValueError``, the error is also an
    instance of that type (an ``ImportError``'s ``name`` and ``path`` carried over)."""
    for like, cls in _LIKE:
        if isinstance(cause, like):
            error = cls(message)
            if isinstance(cause, ImportError) and isinstance(error, ImportError):
                error.name, error.path = cause.name, cause.path
            return error
    return PlatformSelectionError(message)


class ProbeRequired(PlatformSelectionError):
    """Raised by a selection made with ``probe=False`` where only hardware probes could decide.

    ``reason`` says why selection reached the built-ins ("fallback: no platform plugin
    installed"); ``builtins`` names the built-ins start-up would probe, in order, the chain's last
    included; ``serving_fallback`` is the built-in a server uses instead of that last one (None
    when selection was not made as a server's, or the runtime has none).
    """

    def __init__(
        self, runtime: str, reason: str, builtins: tuple[str, ...], serving_fallback: str | None
    ) -> None:
        self.runtime = runtime
        self.reason = reason
        self.builtins = builtins
        self.serving_fallback = serving_fallback
        super().__init__(
            f"{runtime} platform selection needs hardware probes ({reason}): start-up probes "
            f"{', '.join(builtins)} in this order and takes the first available; select with "
            f"probing allowed to learn which"
        )


class Selection(NamedTuple):
    """What a runtime selected in this process.

    ``key`` is ``"plugin:<entry-point name>"`` or ``"builtin:<name>"`` (stable: a supervisor hands
    it to children for ``pin_selection``); ``qualname`` the platform class; ``entry_point`` the
    ``entrypoints.EntryPoint`` that supplied it (None for a built-in) and ``distribution`` the
    distribution that shipped that entry point; ``reason`` one sentence saying why.
    """

    runtime: str
    key: str
    qualname: str
    entry_point: EntryPoint | None
    distribution: str | None
    reason: str

    @property
    def name(self) -> str:
        """The key without its kind: the entry-point or built-in name."""
        return self.key.partition(":")[2]

    @property
    def is_plugin(self) -> bool:
        return self.key.startswith(PLUGIN_PREFIX)


def env_flag(environ: Mapping[str, str], name: str) -> bool:
    """Read a boolean variable; anything but 1/0/true/false/yes/no/on/off is an error."""
    raw = environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise PlatformValueError(f"{name}={environ.get(name)!r} is not a boolean; set it to 1 or 0")


def _listing(eps: list[EntryPoint] | tuple[EntryPoint, ...]) -> str:
    return ", ".join(ep.describe() for ep in eps) or "none installed"


# -- deciding ---------------------------------------------------------------------------------
def resolve(
    spec: RuntimeSpec,
    environ: Mapping[str, str] | None = None,
    pinned: str | None = None,
    serving: bool = False,
    probe: bool = True,
) -> Selection:
    """Decide which platform ``spec``'s runtime uses (see the module docstring for the rules).

    ``serving``: the process serves models, so where the built-in chain ends at a platform that
    cannot run one, the runtime's ``serving_fallback`` built-in is used instead. ``probe=False``:
    run no hardware probe; raise ``ProbeRequired`` where the built-in chain would need one.
    """
    environ = os.environ if environ is None else environ
    if pinned is not None:
        return _pinned(spec, pinned)
    explicit = environ.get(spec.selector_env, "").strip()
    if explicit:
        return _explicit(spec, explicit)
    return _automatic(spec, environ, serving, probe)


def parse_key(spec: RuntimeSpec, key: str) -> tuple[str, str]:
    """Split a selection key into ``("plugin" | "builtin", name)``, or raise naming the format."""
    kind, sep, name = key.partition(":")
    if not sep or not name or kind not in ("plugin", "builtin"):
        raise PlatformValueError(
            f"{key!r} is not a {spec.name} platform key; expected 'plugin:<entry-point name>' or "
            f"'builtin:<name>' (built-ins: {', '.join(b.name for b in spec.builtins)})"
        )
    if kind == "builtin" and spec.builtin(name) is None:
        raise PlatformNotFoundError(
            f"{key!r} names no {spec.name} built-in platform; built-ins: "
            f"{', '.join(b.name for b in spec.builtins)}"
        )
    return kind, name


def _known_builtin(spec: RuntimeSpec, name: str) -> Builtin:
    """The built-in ``name`` of ``spec``, which the caller has checked exists."""
    entry = spec.builtin(name)
    if entry is None:
        raise PlatformNotFoundError(
            f"{spec.name} has no built-in platform {name!r}; built-ins: "
            f"{', '.join(b.name for b in spec.builtins)}"
        )
    return entry


def _pinned(spec: RuntimeSpec, key: str) -> Selection:
    kind, name = parse_key(spec, key)
    reason = f"the launching process, which pinned {key}"
    if kind == "builtin":
        return _builtin_selection(spec, _known_builtin(spec, name), reason)
    return _activate_named(spec, name, reason, how=f"the pinned key {key!r}")


def _explicit(spec: RuntimeSpec, value: str) -> Selection:
    var = spec.selector_env
    alias = value.lower()
    if alias in spec.explicit_builtins:
        return _builtin_selection(
            spec, _known_builtin(spec, alias), f"{var}={value} (built-in, not probed)"
        )
    if alias in spec.reserved_names:
        raise PlatformNotFoundError(
            f"{var}={value} names the built-in {alias!r} platform, which is selected automatically "
            f"only; unset {var} to let detection pick it, or set it to one of "
            f"{', '.join(sorted(spec.explicit_builtins))} or a plugin's entry-point name"
        )
    return _activate_named(spec, value, f"{var}={value}", how=f"{var}={value}")


def _activate_named(spec: RuntimeSpec, name: str, reason: str, how: str) -> Selection:
    """Select the one entry point called ``name``: import and call only its callback."""
    var = spec.selector_env
    installed = entrypoints.entry_points(spec.platform_group)
    matches = [ep for ep in installed if ep.name == name]
    if not matches:
        raise PlatformNotFoundError(
            f"{how}: no {spec.name} platform plugin named {name!r} is installed (entry-point group "
            f"{spec.platform_group!r}; found: {_listing(installed)}); install the plugin package, "
            f"or set {var} to one of the names found, or unset it for automatic selection"
        )
    if len(matches) > 1:
        raise PlatformSelectionError(
            f"{how}: {len(matches)} installed distributions register a {spec.name} platform named "
            f"{name!r} ({_listing(matches)}); uninstall all but one of them"
        )
    ep = matches[0]
    qualname = _call_activate(spec, ep)
    if qualname is None:
        raise PlatformSelectionError(
            f"{how}: platform plugin {ep.describe()} is installed but its activate() returned None "
            f"(its hardware or runtime is unavailable in this process); check the device and its "
            f"driver, or set {var} to another platform, or unset it for automatic selection"
        )
    return _plugin_selection(spec, ep, qualname, reason)


def _automatic(
    spec: RuntimeSpec, environ: Mapping[str, str], serving: bool, probe: bool
) -> Selection:
    var = spec.selector_env
    candidates = list(entrypoints.entry_points(spec.platform_group))
    allowed = (
        entrypoints.allowlist(spec.auto_allowlist_env, environ) if spec.auto_allowlist_env else None
    )
    skipped = [ep for ep in candidates if allowed is not None and ep.name not in allowed]
    if allowed is not None and skipped:
        _log(
            "info", "%s leaves out platform plugins: %s", spec.auto_allowlist_env, _listing(skipped)
        )
        candidates = [ep for ep in candidates if ep.name in allowed]
    _check_names(spec, candidates)

    activated: list[tuple[EntryPoint, str]] = []
    for ep in candidates:
        qualname = _call_activate(spec, ep)
        if qualname is not None:
            activated.append((ep, qualname))
    if len(activated) > 1:
        names = ", ".join(ep.describe() for ep, _ in activated)
        raise PlatformSelectionError(
            f"{len(activated)} {spec.name} platform plugins activated ({names}); only one platform "
            f"can run per process: set {var} to the one to use, e.g. {var}={activated[0][0].name}"
        )
    if activated:
        ep, qualname = activated[0]
        return _plugin_selection(
            spec,
            ep,
            qualname,
            f"automatic discovery ({ep.name!r} is the only platform plugin that activated)",
        )

    lead = "no platform plugin " + (
        "activated" if candidates else "allowed" if skipped else "installed"
    )
    if skipped and spec.auto_allowlist_env:
        env = spec.auto_allowlist_env
        lead += (
            f" ({env}={environ[env]} leaves out {_listing(skipped)}; add their names to {env}, or "
            f"unset it, to admit them to automatic selection, or set {var} to one to select it)"
        )
    for index, entry in enumerate(spec.builtins):
        if (
            not probe
            and entry.probe is not None
            and (entry.env_flag is None or env_flag(environ, entry.env_flag))
        ):
            fallback = spec.serving_fallback if serving else None
            raise ProbeRequired(
                spec.name,
                f"fallback: {lead}",
                tuple(b.name for b in spec.builtins[index:]),
                fallback,
            )
        if _builtin_available(entry, environ):
            if serving and spec.serving_fallback and entry is spec.builtins[-1]:
                served = _known_builtin(spec, spec.serving_fallback)
                also = f" or {served.env_flag}=1" if served.env_flag else ""
                return _builtin_selection(
                    spec,
                    served,
                    (
                        f"fallback: {lead} and {entry.why}, so a server runs on the {served.name.upper()} "
                        f"platform (set {var}{also} to choose explicitly)"
                    ),
                )
            return _builtin_selection(spec, entry, f"fallback: {lead} and {entry.why}")
    raise PlatformSelectionError(  # unreachable with the shipped specs: their chains end unconditionally
        f"no {spec.name} platform is available: no plugin activated and no built-in probe succeeded"
    )


def _check_names(spec: RuntimeSpec, candidates: list[EntryPoint]) -> None:
    var = spec.selector_env
    reserved = [ep for ep in candidates if ep.name.lower() in spec.reserved_names]
    if reserved:
        raise PlatformSelectionError(
            f"{spec.name} platform plugin {_listing(reserved)} uses a name reserved for built-in "
            f"platforms ({', '.join(sorted(spec.reserved_names))}); the plugin's distribution must "
            f"rename its entry point (or uninstall it, or set {var} to select a platform explicitly)"
        )
    if spec.reject_duplicate_names:
        seen: dict[str, list[EntryPoint]] = {}
        for ep in candidates:
            seen.setdefault(ep.name, []).append(ep)
        dups = [eps for eps in seen.values() if len(eps) > 1]
        if dups:
            raise PlatformSelectionError(
                f"several {spec.name} platform plugins share an entry-point name: "
                f"{'; '.join(_listing(eps) for eps in dups)}; uninstall all but one distribution of "
                f"each name (automatic discovery cannot tell them apart)"
            )


def _call_activate(spec: RuntimeSpec, ep: EntryPoint) -> str | None:
    """Import ``ep``'s callback and call it; anything it raises aborts selection."""
    var = spec.selector_env
    try:
        callback = ep.load()
    except Exception as exc:
        raise selection_error(
            f"cannot import the activation callback of {spec.name} platform plugin {ep.describe()}: "
            f"{type(exc).__name__}: {exc}; fix or uninstall that package, or set {var} to select "
            f"another platform",
            exc,
        ) from exc
    if not callable(callback):
        raise PlatformTypeError(
            f"{spec.name} platform plugin {ep.describe()} points at a {type(callback).__name__}, not "
            f"a zero-argument activate() function; fix its entry point"
        )
    try:
        result = callback()
    except Exception as exc:
        raise selection_error(
            f"activate() of {spec.name} platform plugin {ep.describe()} raised "
            f"{type(exc).__name__}: {exc}; start-up stops rather than fall back to a built-in "
            f"platform. Fix that plugin's runtime, or uninstall it, or set {var} to select "
            f"another platform",
            exc,
        ) from exc
    if result is not None and (not isinstance(result, str) or not result.strip()):
        raise PlatformTypeError(
            f"activate() of {spec.name} platform plugin {ep.describe()} returned {result!r}; it must "
            f"return the platform class's qualified name ('package.module.Class') or None"
        )
    return result.strip() if result is not None else None


def _builtin_available(entry: Builtin, environ: Mapping[str, str]) -> bool:
    if entry.env_flag is not None and not env_flag(environ, entry.env_flag):
        return False
    if entry.probe is None:
        return True
    try:
        return bool(entrypoints.import_object(entry.probe)())
    except Exception as exc:  # a probe that cannot run means that device is not usable here
        _log("debug", "probe %s failed: %r", entry.probe, exc)
        return False


def _builtin_selection(spec: RuntimeSpec, entry: Builtin, reason: str) -> Selection:
    return Selection(spec.name, BUILTIN_PREFIX + entry.name, entry.qualname, None, None, reason)


def _plugin_selection(spec: RuntimeSpec, ep: EntryPoint, qualname: str, reason: str) -> Selection:
    return Selection(spec.name, PLUGIN_PREFIX + ep.name, qualname, ep, ep.distribution, reason)


# -- constructing -----------------------------------------------------------------------------
def instantiate(spec: RuntimeSpec, selection: Selection) -> Any:
    """Import ``selection.qualname``, check it against ``spec`` and construct it with no arguments."""
    source = (
        selection.entry_point.describe()
        if selection.entry_point
        else f"built-in {selection.name!r}"
    )
    fix = f"fix the plugin or uninstall it, or set {spec.selector_env} to select another platform"
    try:
        cls = entrypoints.import_object(selection.qualname)
    except Exception as exc:
        raise selection_error(
            f"{spec.name} platform {source} selected {selection.qualname!r}, which cannot be imported: "
            f"{type(exc).__name__}: {exc}; {fix}",
            exc,
        ) from exc
    base = entrypoints.import_object(spec.base_class)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PlatformTypeError(
            f"{spec.name} platform {source} selected {selection.qualname!r}, which is not a subclass "
            f"of {base.__module__}.{base.__qualname__}; every {spec.name} platform class must derive "
            f"from it (SRT: platforms.SRTPlatform, diffusion: platforms.diffusion.Platform)"
        )
    try:
        platform = cls()
    except Exception as exc:
        raise selection_error(
            f"cannot construct {spec.name} platform {selection.qualname}() from {source}: "
            f"{type(exc).__name__}: {exc}; platform classes must be constructible with no arguments "
            f"and without touching the device (put device set-up in init_backend()); {fix}",
            exc,
        ) from exc
    # Identity is checked on the instance, as SGLang reads it: a class may set it in __init__.
    enum_type = entrypoints.import_object(spec.enum_class)
    identity = getattr(platform, "_enum", None)
    if not isinstance(identity, enum_type):
        raise PlatformTypeError(
            f"{spec.name} platform class {selection.qualname!r} sets _enum = {identity!r}, which is "
            f"not a {enum_type.__module__}.{enum_type.__qualname__} member; use that runtime's own "
            f"PlatformEnum (OOT for a plugin)"
        )
    if selection.is_plugin:
        _check_plugin_identity(spec, platform, enum_type, source)
    return platform


_PLACEHOLDER = "unspecified"  # DeviceMixin's value for a class that never set its identity


def _check_plugin_identity(
    spec: RuntimeSpec, platform: object, enum_type: Any, source: str
) -> None:
    """A plugin's platform must say it is out of tree and name its device, once constructed (a
    class attribute, or set by its ``__init__``); raise naming the fix."""
    cls = type(platform)
    name = f"{cls.__module__}.{cls.__qualname__}"
    enum = getattr(platform, "_enum", None)
    if enum is not enum_type.OOT:
        raise PlatformTypeError(
            f"{spec.name} platform {source} selected {name}, whose _enum is {enum!r}, not "
            f"{enum_type.__qualname__}.OOT; a plugin's activate() must return its own class with "
            f"_enum = PlatformEnum.OOT (from {enum_type.__module__}), not a built-in platform "
            f"(to use a built-in, unset {spec.selector_env} and uninstall or disable the plugin)"
        )
    for attr in ("device_name", "device_type"):
        value = getattr(platform, attr, None)
        if not isinstance(value, str) or not value.strip() or value == _PLACEHOLDER:
            what = "is not set" if value == _PLACEHOLDER else f"is {value!r}"
            example = (
                "'my_device'" if attr == "device_name" else "the torch device type, e.g. 'cuda'"
            )
            raise PlatformTypeError(
                f"{spec.name} platform {source} selected {name}, whose {attr} {what} once "
                f"constructed; set {attr} to a non-blank string ({example}), as a class attribute "
                f"or in __init__"
            )
