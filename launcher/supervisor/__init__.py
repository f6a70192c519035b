"""The supervisor of one node's launch and its parts, each module one job.

- ``supervisor``: ``Supervisor``, the life of a launch in order, from open to close;
- ``launch``: ``Launch``, what one running launch holds and what happens to it (status
  messages, exits, silences turned into state, events and the supervisor's inputs); it composes
  the three parts below, each handed only the callables it acts through, never the launch;
- ``healing``: restarting the replicas that heal (``judge`` decides what becomes of a failure);
  ``restarts``: their policy, counts, backoff;
- ``replicas``: the replicas in service, and one replica started, retired or discarded;
- ``rollout``: reloads and scales, one replica at a time; ``steps``: what they do next (pure);
  ``revision``: what replicas are started with, and what a reload may change;
- ``workers``: ``Worker``, a child as every part sees it;
- ``plan``: which children a node starts and what each is told (``ProcessSpec``s);
- ``output``: the workers' output pipes, read line by line;
- ``watchdog``: heartbeats of ready workers;
- ``ops``: the ops channel (events out, snapshots and missed events on request; the events
  themselves are ``launchspec.events``);
- ``state``: the launch's state as ops tooling sees it;
- ``rundir``: the private runtime directory and the state file;
- ``signals``, ``notify``, ``secrets``: signals, systemd notifications, the API key;
- ``diagnose``: the root cause of each kind of failure (``launchspec.causes`` holds the exit
  codes, ``RootCause`` and ``LaunchError``).

Spawning, watching and stopping children and their process trees is the bootstrap's parent end
(``bootstrap.children``, ``bootstrap.proctree``). Importing this package imports none of them;
``Supervisor``, ``LaunchOutcome`` and ``run_supervisor`` load ``supervisor`` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LaunchOutcome", "Supervisor", "run_supervisor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from launcher.supervisor import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module 'launcher.supervisor' has no attribute {name!r}")
