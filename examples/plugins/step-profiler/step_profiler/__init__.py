"""Profiling: how long the scheduler's steps take, and how much of that is the model's forward.

``Scheduler.run_batch`` runs one step (for generation also the admission's bookkeeping, the
sampling and the tensor-parallel broadcast around the forward); ``TpModelWorker``'s
``forward_batch_generation`` is the forward itself. Every ``STEP_PROFILER_EVERY`` steps (100 by
default) the scheduler process prints one line::

    step-profiler: 100 steps, 2.31 ms per step (max 9.80 ms), forward 1.95 ms (84%), 3.2 requests per step

Both hooks are ``AROUND`` hooks with SGLang's names, so this runs unchanged under SGLang too.
"""

import os
import time

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

STEP = "sglang.srt.managers.scheduler.Scheduler.run_batch"
FORWARD = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"


class Profile:
    """The figures since the last line: steps, their seconds, the longest, the forward's
    seconds and the requests the steps ran."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.seconds = self.longest = self.forward = 0.0
        self.reqs = 0

    def step(self, seconds: float, reqs: int) -> None:
        self.steps += 1
        self.seconds += seconds
        self.longest = max(self.longest, seconds)
        self.reqs += reqs
        if self.steps >= self.every:
            self.report()

    def report(self) -> None:
        per = self.seconds / self.steps
        share = self.forward / self.seconds if self.seconds else 0.0
        print(
            f"step-profiler: {self.steps} steps, {per * 1000:.2f} ms per step "
            f"(max {self.longest * 1000:.2f} ms), forward {self.forward / self.steps * 1000:.2f} ms "
            f"({share:.0%}), {self.reqs / self.steps:.1f} requests per step",
            flush=True,
        )
        self.reset()


PROFILE = Profile(int(os.environ.get("STEP_PROFILER_EVERY", "100")))


def time_step(original_fn, self, batch, *args, **kwargs):
    started = time.perf_counter()
    try:
        return original_fn(self, batch, *args, **kwargs)
    finally:
        PROFILE.step(time.perf_counter() - started, len(batch.reqs))


def time_forward(original_fn, *args, **kwargs):
    started = time.perf_counter()
    try:
        return original_fn(*args, **kwargs)
    finally:
        PROFILE.forward += time.perf_counter() - started


def register():
    HookRegistry.register(STEP, time_step, HookType.AROUND)
    HookRegistry.register(FORWARD, time_forward, HookType.AROUND)
