"""The platform conformance check behind ``sglang-launch check-platform``.

The checks run the platform contract (``spec/plugin-system.mdx``) against the platform a launch
would select, on this machine's real device, one row per check: pass, fail, missing (an optional
method whose contract default raises ``NotImplementedError`` is not implemented; a required one,
which a launch calls, fails instead) or skipped (with why). The last rows, the ``workload`` group,
run the serving runtime's own path on the platform; the platform conforms only when no row failed
and every workload row passed.

Layout, each module one job:

- ``rows``: the ``Row`` record, the four statuses and the outcomes a check raises;
- ``catalog``: the ordered registry of checks (``@check``) and ``checks_for(runtime)``;
- ``selection``, ``device``, ``distributed``, ``execution``, ``lifecycle``, ``subsystems``,
  ``diffusion``, ``workload``: the checks themselves, by area of the contract (torch is imported
  inside them, never at module scope, so the parent can list the catalog without torch; the
  workload imports the serving runtime, in the check process only);
- ``child``: ``run_checks(server_args, ctx)``, the worker target the bootstrap calls in the
  spawned check process; it streams every row to a file as it goes;
- ``parent``: spawns that process through ``bootstrap.run`` and collects what it reported, or
  how it died;
- ``report``: turns the child's rows (or its death) into the final report, the terminal table
  and the JSON document.

Importing this package imports no torch.
"""
