"""The errors both runtimes raise for what a user can fix.

``InputError``: one request's input cannot run (too long, empty, a size the pipeline cannot
make); the scheduler answers that request alone with a 400 whose ``param`` names the request
field to change, and goes on. ``ModelLoadError``: the model cannot be served as configured; it
ends start-up, and its message names the argument or file to change.
"""

from __future__ import annotations


class InputError(ValueError):
    """One request's input is unusable; the message names the limit and the fix, ``param`` the
    request field the client must change (``"input"``, ``"max_new_tokens"``, ``"width"``, ...)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ModelLoadError(RuntimeError):
    """The model cannot be served as configured; the message names the fix."""
