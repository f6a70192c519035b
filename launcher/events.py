"""The ops events where tools import them: ``from launcher import events``.

Every event kind is a msgspec struct of ``launchspec.events`` (the shared floor, read by the
supervisor, the HTTP child and the CLI alike); this module re-exports its public names, the same
objects, so ``launcher.events.decode`` and ``launchspec.events.decode`` are one function.
"""

from launchspec.events import *  # noqa: F403
from launchspec.events import __all__  # noqa: F401
