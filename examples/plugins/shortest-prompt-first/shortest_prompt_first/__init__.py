"""A scheduling policy: the waiting requests are admitted shortest prompt first.

Before each step decides what runs, the waiting queue is put in order of prompt length (the
shortest first; requests of one length keep their order), so a short request that arrives
behind long ones is admitted before them. Written with SGLang's names only, as an SGLang plugin
is: ``Scheduler.get_next_batch_to_run`` admits from ``self.waiting_queue`` in its order, and a
request's ``origin_input_ids`` are its prompt's tokens.
"""

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

TARGET = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"


def shortest_first(original_fn, self, *args, **kwargs):
    self.waiting_queue.sort(key=lambda req: len(req.origin_input_ids))
    return original_fn(self, *args, **kwargs)


def register():
    """The entry point: called once in every process of a launch."""
    HookRegistry.register(TARGET, shortest_first, HookType.AROUND)
