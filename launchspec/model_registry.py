"""Out-of-tree model classes: SGLang's ``ModelRegistry`` (``sglang.srt.models.registry``).

A plugin brings its own model implementations as SGLang's plugins do, from its callback:

    from sglang.srt.models.registry import ModelRegistry  # or launchspec.model_registry

    def register():
        ModelRegistry.register("vendor_pkg.models", overwrite=True)

``register(package_name, overwrite=False, strict=False)`` names a package whose modules each
define ``EntryClass`` (a class, or a list of classes); each class is registered for the
architecture of its own name (``config.json``'s ``architectures[0]``), and the text runtime loads
a model of that architecture with it instead of transformers' auto class.

Plugin callbacks run in every process of a launch, the launcher's included, and the launcher
never imports torch or model code. So ``register`` only records the package: nothing is imported
until a process that loads a model asks for a class (``find``, ``resolve_model_cls``,
``get_supported_archs``), and then every recorded package is imported once, in the order it was
registered (``import_model_classes``). That is why the registry lives here, in the shared floor
that both the launcher and the workers read, standard library only: a callback may call it in any
process, and only the scheduler, which loads the model, pays for the import. What a registration
means is checked when the classes are imported, not when ``register`` is called: an architecture
registered twice without ``overwrite`` is a ``ValueError`` then, naming it. Only a package that
cannot be found at all fails at ``register`` (``ModuleNotFoundError``, raised in the plugin's
callback, so the launch stops at start-up naming the plugin), checked where that costs no import.

A module of the package whose import fails (it imports SGLang internals this project does not
provide, say) is skipped with a warning, as SGLang skips it; ``strict=True`` makes that an error.
Assigning ``ModelRegistry.models[arch] = cls`` registers a class already imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
import sys
import threading
from collections.abc import KeysView
from typing import Any

log = logging.getLogger("sglang_launch.models")


def import_model_classes(package_name: str, strict: bool = False) -> dict[str, type]:
    """``{class name: class}`` of the ``EntryClass`` of every module of ``package_name`` (a
    package whose modules are imported, subpackages left out; or a single module, whose own
    ``EntryClass`` is taken). A module that fails to import is skipped with a warning unless
    ``strict``; two entries of one name are a ``ValueError``."""
    package = importlib.import_module(package_name)
    modules: list[Any] = [package]
    for info in pkgutil.iter_modules(getattr(package, "__path__", []), package_name + "."):
        if info.ispkg:
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except Exception as exc:
            if strict:
                raise
            log.warning(
                "model module %s skipped: it failed to import (%s: %s)",
                info.name,
                type(exc).__name__,
                exc,
            )
    found: dict[str, type] = {}
    for module in modules:
        entry = getattr(module, "EntryClass", None)
        if entry is None:
            continue
        for cls in entry if isinstance(entry, (list, tuple)) else [entry]:
            name = getattr(cls, "__name__", None)
            if not isinstance(cls, type) or not name:
                raise ValueError(
                    f"{module.__name__}.EntryClass holds {cls!r}, not a class; set it to the model "
                    f"class or a list of model classes"
                )
            if name in found and found[name] is not cls:
                raise ValueError(
                    f"two model classes named {name} in {package_name} ({found[name].__module__} "
                    f"and {cls.__module__}); an architecture has one implementation"
                )
            found[name] = cls
    return found


def _check_locatable(name: str) -> None:
    """``ModuleNotFoundError`` when ``name`` cannot be found, as SGLang's own ``register`` fails
    at once (it imports the package there and then). Only checked where the parent package is
    already imported (a plugin registering its own ``vendor_pkg.models``), so that finding it
    imports nothing: the package itself is still imported only where a model is loaded."""
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        return
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(
            f"ModelRegistry.register({name!r}): there is no module named {name!r}; register the "
            f"package that holds the plugin's model modules (each defining EntryClass)",
            name=name,
        )


class _ModelRegistry:
    """The architectures plugins registered classes for (see the module docstring)."""

    def __init__(self) -> None:
        self.models: dict[str, type] = {}  # architecture -> class, once imported
        self._pending: list[tuple[str, bool, bool]] = []  # (package, overwrite, strict)
        self._registered: list[str] = []
        self._lock = threading.RLock()  # an imported module may register more

    def register(self, package_name: str, overwrite: bool = False, strict: bool = False) -> None:
        """Register the ``EntryClass`` of every module of ``package_name``, imported when a
        class is first asked for (the module docstring). ``overwrite``: replace a class an
        earlier registration gave the same architecture (else that is a ``ValueError``)."""
        if not isinstance(package_name, str) or not package_name.strip():
            raise TypeError(
                f"ModelRegistry.register takes a package name such as 'vendor_pkg.models', "
                f"not {package_name!r}"
            )
        name = package_name.strip()
        _check_locatable(name)
        with self._lock:
            self._pending.append((name, bool(overwrite), bool(strict)))
            self._registered.append(name)

    def packages(self) -> list[str]:
        """The packages registered in this process, in order (none of them imported by this)."""
        return list(self._registered)

    def load(self) -> dict[str, type]:
        """Import the packages registered since the last call and return every registered
        class by architecture."""
        with self._lock:
            while self._pending:
                package, overwrite, strict = self._pending.pop(0)
                for arch, cls in import_model_classes(package, strict=strict).items():
                    known = self.models.get(arch)
                    if known is not None and known is not cls and not overwrite:
                        raise ValueError(
                            f"model architecture {arch} is already registered (by "
                            f"{known.__module__}); register {package!r} with overwrite=True "
                            f"to replace it"
                        )
                    self.models[arch] = cls
            return self.models

    def find(self, architecture: str) -> type | None:
        """The class registered for ``architecture``, or None (the runtime then uses
        transformers' auto class)."""
        if not self._pending and not self.models:
            return None
        return self.load().get(architecture)

    def get_supported_archs(self) -> KeysView[str]:
        """The registered architectures (this project's own are transformers', not listed)."""
        return self.load().keys()

    def is_arch_supported(self, architecture: str) -> bool:
        return architecture in self.load()

    def resolve_model_cls(self, architectures: str | list[str]) -> tuple[type, str]:
        """``(class, architecture)`` for the first of ``architectures`` that is registered;
        ``ValueError`` when none is."""
        names = [architectures] if isinstance(architectures, str) else list(architectures)
        models = self.load()
        for arch in names:
            if arch in models:
                return models[arch], arch
        raise ValueError(
            f"model architectures {names} are not registered; registered: "
            f"{sorted(models) or 'none'} (the text runtime serves the others with transformers)"
        )


ModelRegistry = _ModelRegistry()
