"""A runtime's process-level platform state, and the lazy ``current_platform`` proxy.

``PlatformSlot`` holds, for one ``RuntimeSpec``, what this process selected, the constructed
platform and its once-per-process backend initialization. Resolution happens on first need,
once, behind a lock (threads that arrive together wait for the first); a failure is remembered
and re-raised. A platform's activation or construction that touches ``current_platform`` again
gets an error instead of a deadlock.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from . import _selection
from ._selection import PlatformSelectionError, Selection
from .once import ProcessOnce
from .runtimes import RuntimeSpec

_slots: weakref.WeakSet[PlatformSlot] = weakref.WeakSet()


class PlatformSlot:
    """The platform state of one runtime in this process."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._lock = threading.RLock()
        self._pinned: str | None = None
        self._serving = False
        self._selection: Selection | None = None
        self._platform = None
        self._error: Exception | None = None
        self._busy = False  # this process is inside resolution (re-entry detection)
        self._init = ProcessOnce(f"{spec.name} backend initialization")
        _slots.add(self)

    # -- selection ------------------------------------------------------------------------
    def pin(self, key: str) -> None:
        """Select exactly ``key`` when resolution happens; see ``platforms.pin_selection``."""
        _selection.parse_key(self.spec, key)
        with self._lock:
            if self._selection is not None or self._error is not None:
                if self._selection is not None and self._selection.key == key:
                    return
                done = (
                    self._selection.key
                    if self._selection
                    else f"a failed selection ({self._error})"
                )
                raise PlatformSelectionError(
                    f"cannot pin the {self.spec.name} platform to {key!r}: this process already "
                    f"resolved {done}; call pin_selection() before anything touches current_platform"
                )
            self._pinned = key

    def serve(self) -> None:
        """Resolve as a server does; see ``platforms.use_serving_fallback``."""
        with self._lock:
            self._serving = True

    def selection(self, probe: bool = True) -> Selection:
        """What this runtime selected, resolving it first if needed; see
        ``platforms.current_selection`` for ``probe=False``."""
        selection = self._selection
        if selection is not None:
            return selection
        if not probe:
            with self._lock:
                self._raise_if_failed_or_busy()
                if self._selection is not None:
                    return self._selection
                self._busy = True
                try:  # a preview: neither the selection nor its error is remembered
                    return _selection.resolve(
                        self.spec, os.environ, self._pinned, self._serving, probe=False
                    )
                finally:
                    self._busy = False
        with self._lock:
            self._raise_if_failed_or_busy()
            if self._selection is None:
                self._busy = True
                try:
                    self._selection = _selection.resolve(
                        self.spec, os.environ, self._pinned, self._serving
                    )
                except Exception as exc:  # remembered; an interrupt is not a verdict
                    self._error = exc
                    raise
                finally:
                    self._busy = False
            return self._selection

    def platform(self) -> Any:
        """The selected platform instance, constructing it on first use."""
        platform = self._platform
        if platform is not None:
            return platform
        with self._lock:
            if self._platform is None:
                selection = self.selection()
                self._raise_if_failed_or_busy()
                self._busy = True
                try:
                    self._platform = _selection.instantiate(self.spec, selection)
                except Exception as exc:  # remembered; an interrupt is not a verdict
                    self._error = exc
                    raise
                finally:
                    self._busy = False
            return self._platform

    def _raise_if_failed_or_busy(self) -> None:
        if self._error is not None:
            raise self._error
        if self._busy:  # the RLock let the resolving thread back in: a callback touched us
            raise PlatformSelectionError(
                f"the {self.spec.name} current_platform was used while its platform was being "
                f"selected or constructed (from an activate() callback or a platform __init__); "
                f"activation must stay import-safe: move that code into init_backend()"
            )

    # -- initialization -------------------------------------------------------------------
    def initialize(self) -> Any:
        """Run the selected platform's ``init_backend()`` at most once in this process."""
        platform = self.platform()
        self._init.run(platform.init_backend)
        return platform

    def _after_fork(self) -> None:
        self._lock = threading.RLock()
        self._busy = False


def _after_fork_in_child() -> None:
    for slot in list(_slots):
        slot._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class LazyPlatform:
    """``current_platform``: stands for the selected platform, resolving it on first use.

    Attribute access, ``isinstance`` checks and ``str()`` reach the real platform instance;
    importing the name resolves nothing, so plugin modules may import it at module scope.
    """

    __slots__ = ("_slot",)

    def __init__(self, slot: PlatformSlot) -> None:
        object.__setattr__(self, "_slot", slot)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._slot.platform(), name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._slot.platform(), name, value)

    @property  # type: ignore[misc]
    def __class__(
        self,
    ) -> type:  # makes isinstance(current_platform, SRTPlatform) answer for the instance
        return type(self._slot.platform())

    def __dir__(self) -> list[str]:
        return dir(self._slot.platform())

    def __eq__(self, other: object) -> bool:
        return self._slot.platform() == (
            other._slot.platform() if isinstance(other, LazyPlatform) else other
        )

    def __hash__(self) -> int:
        return hash(self._slot.platform())

    def __str__(self) -> str:
        platform = self._slot.platform()
        selection = self._slot.selection()
        cls = type(platform)
        source = f" from {selection.distribution}" if selection.distribution else ""
        return (
            f"{cls.__qualname__} ({cls.__module__}) on device {platform.device_type!r} "
            f"[{platform.device_name}]: {self._slot.spec.name} {selection.key}{source}, "
            f"selected by {selection.reason}"
        )

    def __repr__(self) -> str:
        return f"<current_platform: {self}>"
