"""``ctx.stopping`` as a SIGTERM handler raises it: without its lock, seen at once by a poller,
and still waking a thread blocked in ``wait()``."""

from __future__ import annotations

import threading

from bootstrap.context import StopEvent, WorkerContext


def test_a_request_needs_no_lock_and_is_seen_by_the_next_poll():
    stopping = StopEvent()
    with stopping._cond:  # where a handler may land: its thread inside wait(), holding the lock
        stopping.request()
        assert stopping.is_set() and stopping.wait(0)


def test_set_still_wakes_a_thread_blocked_in_wait():
    stopping = StopEvent()
    woke = threading.Event()

    def waiter() -> None:
        if stopping.wait(60):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    stopping.request()
    stopping.set()
    thread.join(60)
    assert woke.is_set()


def test_a_worker_context_stops_on_a_stop_event_by_default():
    ctx = WorkerContext("scheduler", 0, 0, 1, 1, 1, "", "", "", "cpu")
    assert isinstance(ctx.stopping, StopEvent) and not ctx.stopping.is_set()
