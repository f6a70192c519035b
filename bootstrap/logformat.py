"""The one format of the lines sglang-launch writes: every line starts ``sglang-launch: ``.

The launcher's own lines say what happens to the launch (``sglang-launch: http.0 (pid 12)
ready 0.52s``, ``sglang-launch: ready at http://...``). A log record, the launcher's or a
worker's, is ``sglang-launch: [WORKER ]LEVEL LOGGER: MESSAGE`` (``LINE`` matches it): the worker's
name (``http.0``, ``scheduler.1``) only in a worker's records, and every line of a record that
spans several (a traceback, a warning with its source line) carries the same head, so no line
of the output is in another format and each can be told apart by a ``grep``.

What libraries log in a child goes through the same format: ``configure_child_logging`` gives the
root logger a handler with ``LineFormatter``, sends Python warnings there
(``logging.captureWarnings``), and takes the stderr handler transformers and diffusers install on
their own loggers away as each of them loads (``route_library_logging``), so their records reach
the root logger too. The HTTP worker starts uvicorn with no logging configuration of its own, so
its records propagate the same way; ``uvicorn.error``, the logger
of every line uvicorn writes, errors or not, is shown as ``uvicorn``.

Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

PREFIX = "sglang-launch:"

# A record's line: the head (the worker's name in a worker's records), the level, the logger.
LINE = re.compile(
    r"^sglang-launch: (?:(?P<worker>[a-z_]+\.\d+) )?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<logger>[\w.\-]+): (?P<message>.*)$"
)

# Logger names shown otherwise: uvicorn writes every line, errors or not, to "uvicorn.error".
_SHOWN_AS = {"uvicorn.error": "uvicorn"}

# The modules whose loading installs a library's own stderr handler, and what undoes it.
_LIBRARY_LOGGING = ("transformers.utils.logging", "diffusers.utils.logging")


class LineFormatter(logging.Formatter):
    """``sglang-launch: [WORKER ]LEVEL LOGGER: MESSAGE``, the head repeated on every line."""

    def __init__(self, worker: str | None = None) -> None:
        super().__init__("%(message)s")
        self.head = f"{PREFIX} {worker} " if worker else f"{PREFIX} "

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)  # the message, then the traceback or stack, if any
        name = _SHOWN_AS.get(record.name, record.name)
        head = f"{self.head}{record.levelname} {name}: "
        return "\n".join(head + line for line in text.splitlines() or [""])


def configure_child_logging(worker: str, level: str) -> None:
    """A child's logging in the one format: a stderr handler on the root logger (unless one is
    configured already), Python warnings as records, libraries' own handlers taken away."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(LineFormatter(worker))
        root.addHandler(handler)
        root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    logging.captureWarnings(True)
    route_library_logging()


def route_library_logging(modules: Sequence[str] = _LIBRARY_LOGGING) -> None:
    """Make transformers' and diffusers' loggers propagate to the root logger, with their own
    stderr handler removed: at once for a library already loaded, else as it loads."""
    pending = []
    for name in modules:
        module = sys.modules.get(name)
        if module is not None:
            _propagate(module)
        else:
            pending.append(name)
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport({name: _propagate for name in pending}))


def _propagate(module: types.ModuleType) -> None:
    """transformers' and diffusers' ``utils.logging`` share these two functions."""
    try:
        module.disable_default_handler()
        module.enable_propagation()
    except Exception:  # noqa: BLE001 - a library that changed: its lines keep their own format
        logging.getLogger(__name__).debug("could not route %s", module.__name__, exc_info=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``actions[name](module)`` right after the module ``name`` is executed."""

    def __init__(self, actions: dict[str, Callable[[types.ModuleType], None]]) -> None:
        self.actions = actions

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        action = self.actions.get(fullname)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if isinstance(spec.loader, importlib.abc.Loader) and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, action)
        return spec


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then ``action`` on the module it executed."""

    def __init__(self, loader: Any, action: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._action = action

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._action(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)
