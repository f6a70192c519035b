"""The platform conformance check behind ``sglang-launch check-platform``.

The checks run the platform contract (``spec/plugin-system.mdx``) against the platform a launch
would select, on this machine's real device, one row per check: pass, fail, missing (a method
whose contract default raises ``NotImplementedError`` is not implemented) or skipped (with why).

Layout, each module one job:

- ``rows``: the ``Row`` record, the four statuses and the outcomes a check raises;
- ``catalog``: the ordered registry of checks (``@check``) and ``checks_for(runtime)``;
- ``selection``, ``device``, ``distributed``, ``execution``, ``lifecycle``, ``subsystems``,
  ``diffusion``: the checks themselves, by area of the contract (torch is imported inside them,
  never at module scope, so the parent can list the catalog without torch);
- ``child``: ``run_checks(server_args, ctx)``, the worker target the bootstrap calls in the
  spawned check process; it streams every row to a file as it goes;
- ``parent``: spawns that process through ``bootstrap.run`` and collects what it reported, or
  how it died;
- ``report``: turns the child's rows (or its death) into the final report, the terminal table
  and the JSON document.

Importing this package imports no torch.
"""
