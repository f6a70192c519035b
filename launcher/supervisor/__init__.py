"""The supervisor of one node's launch and its parts, each module one job.

- ``supervisor``: ``Supervisor``, the life of a launch in order, from open to close;
- ``launch``: ``Launch``, what one running launch holds and what happens to it (status
  messages, exits, silences turned into state, events and the supervisor's inputs);
- ``plan``: which children a node starts and what each is told (``ProcessSpec``s);
- ``children``: spawning, watching and stopping child processes;
- ``output``: the workers' output pipes, read line by line;
- ``healing``: restarting the replicas that heal; ``restarts``: their policy, counts, backoff;
- ``watchdog``: heartbeats of ready workers;
- ``proctree``: stopping whole process trees;
- ``ops``: the ops channel (events out, snapshots and missed events on request; the events
  themselves are ``launchspec.events``);
- ``state``: the launch's state as ops tooling sees it;
- ``rundir``: the private runtime directory and the state file;
- ``signals``, ``notify``, ``secrets``: signals, systemd notifications, the API key;
- ``causes``: exit codes, root causes and ``LaunchError``; ``diagnose``: the root cause of each
  kind of failure.

Importing this package imports none of them; ``Supervisor``, ``LaunchOutcome`` and
``run_supervisor`` load ``supervisor`` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LaunchOutcome", "Supervisor", "run_supervisor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from launcher.supervisor import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module 'launcher.supervisor' has no attribute {name!r}")
