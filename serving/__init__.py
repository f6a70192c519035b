"""The reference serving runtime: the code that runs inside worker children, and only there.

- ``serving.srt``: the text runtime's scheduler (``serving.srt.scheduler.run_scheduler_process``,
  one per rank) and its model runner (embeddings and generation with transformers);
- ``serving.diffusion``: the diffusion runtime's worker (``serving.diffusion.scheduler
  .run_scheduler_process``) and its diffusers pipeline runner;
- ``serving.http``: the one HTTP child of a launch (``serving.http.server.run_http_server``):
  the ASGI app, its routes, and the client of the schedulers' sockets;
- ``serving.scheduler``: the batching scheduler both runtimes' schedulers subclass (socket,
  queue, batch timing, failure policy, broadcasts to a replica's other ranks, ``follow``);
- ``serving.errors``: ``InputError`` (a 400 naming the request field) and ``ModelLoadError``;
- ``serving.threads``: torch's CPU threads in a scheduler process;
- ``serving.wire``: the messages between the HTTP child and the schedulers, and what a scheduler
  reports about itself (ready info, ``Pong`` stats);
- ``serving.distributed``: the torch.distributed groups of a replica's ranks.

The launcher names these targets by dotted path and never imports them; the bootstrap resolves
them inside the child, after plugin hooks are applied, so a ``REPLACE`` hook on them takes effect.
"""
