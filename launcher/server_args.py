"""``ServerArgs`` where applications import it: ``from launcher.server_args import ServerArgs``.

The class and everything around it are defined in ``launchspec.server_args``, the shared floor
the worker processes read too; this module re-exports that module's public names (the same
objects). Hook targets name the defining module: ``launchspec.server_args.ServerArgs.<method>``.
"""

from launchspec.server_args import *  # noqa: F403
from launchspec.server_args import __all__  # noqa: F401
