"""``ProcessSpec``: everything a child needs, made of standard-library types only.

The spec is the one argument of the ``spawn`` target, so multiprocessing pickles it. Keeping it to
``str``/``int``/``float``/``dict``/``bytes`` means unpickling it in the child imports nothing but
this module: the ``ServerArgs`` travel as opaque msgpack ``payload`` bytes and are decoded only
after the platform is initialized and the plugin hooks are applied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class ProcessSpec:
    """One child process of a launch.

    - ``role``, ``rank``: the worker's identity; its id on the wire is ``"<role>.<rank>"``.
      ``rank`` is the global rank, ``local_rank`` the rank on this node.
    - ``world_size``, ``tp_size``, ``dp_size``: the launch's ranks in all, per tensor-parallel
      group and the number of groups (the worker's ``WorkerContext`` carries them).
    - ``target``: the worker function, ``"pkg.mod.func"`` or ``"pkg.mod:func"``, resolved in the
      child after hooks are applied and called as ``target(server_args, ctx)``.
    - ``payload``: the server arguments as ``bootstrap.payload.encode_payload(args)`` bytes.
    - ``runtime``: ``"srt"`` or ``"diffusion"``: which platform selection and hook registry the
      child uses.
    - ``platform_key``: the supervisor's ``Selection.key``; the child pins it so both select the
      same platform. ``None`` lets the child resolve on its own (tools, tests).
    - ``status_endpoint``: the supervisor's ZeroMQ PULL address for ``bootstrap.messages``.
    - ``parent_pid``: the supervisor's pid, checked when orphan protection is armed; ``None``
      means "whoever my parent is at start-up".
    - ``env``: variables set in the child before any platform or plugin code runs.
    - ``args_class``: dotted path of the ServerArgs class, looked up after hooks (a REPLACE of the
      class applies), so the child builds the class its own plugins make of that name.
    - ``heartbeat_interval``: seconds between heartbeats; 0 sends none.
    - ``entry_points``: the supervisor's ``platforms.entrypoints.snapshot()``; the child adopts it
      instead of reading entry-point metadata again. ``None``: the child reads it itself.
    - ``stop_marker``: a file the supervisor creates right before it sends this child SIGTERM.
      When set, a SIGTERM while the file is absent and the supervisor alive is ignored: it was
      meant for the whole process group or cgroup, and the supervisor orders the stop itself.
      Empty: every SIGTERM stops the child.
    - ``serving_fallback``: a child that selects on its own (no ``platform_key``) resolves as a
      server does (``platforms.use_serving_fallback``).
    - ``aliases``: the table of SGLang names this project answers to (``hooks.compat.AliasTable``
      as data), installed before anything selects a platform or loads a plugin; empty: none.
    """

    role: str
    target: str
    payload: bytes
    status_endpoint: str
    args_class: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    tp_size: int = 1
    dp_size: int = 1
    runtime: str = "srt"
    platform_key: str | None = None
    runtime_dir: str = ""
    ops_endpoint: str = ""
    query_endpoint: str = ""
    parent_pid: int | None = field(default_factory=os.getpid)
    env: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    heartbeat_interval: float = 0.0
    entry_points: tuple[tuple[str, str, str, str | None], ...] | None = None
    serving_fallback: bool = False
    stop_marker: str = ""
    aliases: dict[str, object] = field(default_factory=dict)

    @property
    def worker_id(self) -> str:
        return f"{self.role}.{self.rank}"

    def __post_init__(self) -> None:
        from platforms.runtimes import RUNTIMES

        if self.runtime not in RUNTIMES:
            raise ValueError(
                f"ProcessSpec.runtime is {self.runtime!r}; use one of {', '.join(RUNTIMES)}"
            )
        if not isinstance(self.payload, bytes):
            raise TypeError(
                "ProcessSpec.payload must be bytes from bootstrap.payload.encode_payload(), "
                f"not {type(self.payload).__name__}"
            )
