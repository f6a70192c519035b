"""The reference serving runtime: worker targets the bootstrap calls as ``target(server_args, ctx)``.

``scheduler.run_scheduler_process`` runs one data-parallel replica (all its tensor-parallel ranks
run it, rank 0 takes requests); ``http_server.run_http_server`` runs the one HTTP child. Nothing
here is imported by ``launcher`` at module scope: the bootstrap resolves these targets inside the
child, after plugin hooks are applied, so a ``REPLACE`` hook on them takes effect.
"""
