"""The API key: where it may come from, and the one place it is resolved.

Three sources, the first two recommended: ``--api-key-file PATH`` (the first line of the file,
surrounding whitespace stripped), the ``SGLANG_API_KEY`` environment variable, and ``--api-key KEY``
on the command line, which every local user can read in the process list
(``/proc/<pid>/cmdline``) and which therefore draws a warning. The resolved key travels to the
workers inside the spawn payload (a pipe), never in a file, a command line or their environment
(no worker inherits ``SGLANG_API_KEY``); the state file's argv, events and status output show it
as ``***``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchspec.server_args import ServerArgs

log = logging.getLogger("launcher")

API_KEY_ENV = "SGLANG_API_KEY"
REDACTED = "***"
_KEY_FLAGS = ("--api-key",)


class ApiKeyError(ValueError):
    """The key's source is unusable; the message names the problem and the fix."""


def resolve_api_key(args: ServerArgs) -> None:
    """Fill ``args.api_key`` from ``args.api_key_file`` or ``SGLANG_API_KEY`` when the key was not
    given directly; raise ``ApiKeyError`` for a file that cannot be read, an empty key, or two
    sources at once."""
    key_file = args.api_key_file
    if key_file:
        if args.api_key:
            raise ApiKeyError(
                "--api-key and --api-key-file were both given; keep only --api-key-file"
            )
        try:
            with open(key_file, encoding="utf-8") as fh:
                first = fh.readline().strip()
        except OSError as exc:
            raise ApiKeyError(
                f"--api-key-file {key_file}: cannot read it ({exc.strerror or exc}); give a readable file "
                "holding the key on its first line"
            ) from exc
        except UnicodeDecodeError as exc:
            raise ApiKeyError(
                f"--api-key-file {key_file} is not UTF-8 text; put the key on its first line"
            ) from exc
        if not first:
            raise ApiKeyError(f"--api-key-file {key_file} is empty; put the key on its first line")
        args.api_key = first
        return
    if not args.api_key and os.environ.get(API_KEY_ENV, "").strip():
        args.api_key = os.environ[API_KEY_ENV].strip()


def warn_if_on_command_line(argv: list[str]) -> None:
    """Warn that ``--api-key KEY`` on the command line is readable by every local user."""
    if any(a == "--api-key" or a.startswith("--api-key=") for a in argv):
        log.warning(
            "--api-key on the command line is visible to every local user in the process list; "
            "use --api-key-file PATH or the %s environment variable instead",
            API_KEY_ENV,
        )


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of ``--api-key`` replaced by ``***``."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in _KEY_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in _KEY_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out
