"""Pipeline calls taking turns (``serving.diffusion.stepping``) and embedding requests sharing
batches (``serving.srt.embedding``), on real threads and real queue entries: who runs when, what
a stop or an error leaves, and which texts go into each batch."""

from __future__ import annotations

import threading

import pytest

from serving import wire
from serving.diffusion.stepping import DenoiseStopped, SteppedCall
from serving.srt.embedding import EmbedReq, take_texts


def counting_call(steps: int, log: list[tuple[str, int]], name: str):
    """A call of ``steps`` steps that notes each step it takes, and in which thread."""

    def run(step):
        for done in range(1, steps + 1):
            log.append((name, done))
            assert threading.current_thread().name == name
            if step(done, steps):
                raise DenoiseStopped(f"stopped after step {done}")
        return f"{name} done"

    return SteppedCall(run, name)


def test_calls_run_one_step_per_turn_in_the_order_they_are_given_turns():
    log: list[tuple[str, int]] = []
    a, b = counting_call(3, log, "a"), counting_call(2, log, "b")
    assert not a.started and not a.advance() and (a.done, a.total) == (1, 3)
    assert not b.advance() and not b.advance()
    assert not a.advance()
    assert b.advance() and b.result == "b done" and b.error is None  # after its last step
    assert not a.advance() and a.advance() and a.result == "a done"
    assert log == [("a", 1), ("b", 1), ("b", 2), ("a", 2), ("a", 3)]
    assert a.advance()  # an ended call stays ended


def test_a_stop_ends_the_call_at_the_step_it_is_paused_at():
    log: list[tuple[str, int]] = []
    call = counting_call(900, log, "long")
    assert not call.advance() and not call.advance()
    assert call.advance(stop=True)
    assert isinstance(call.error, DenoiseStopped) and call.result is None
    assert log == [("long", 1), ("long", 2)]
    never = counting_call(5, log, "never")
    assert never.advance(stop=True) and isinstance(never.error, DenoiseStopped)
    assert not never.started and len(log) == 2  # a call stopped before its first step never runs


def test_an_error_of_the_call_is_handed_to_the_caller():
    def run(step):
        step(1, 2)
        raise RuntimeError("the denoiser failed")

    call = SteppedCall(run, "failing")
    assert not call.advance()
    assert call.advance() and isinstance(call.error, RuntimeError)


def item(rid: str, texts: int) -> EmbedReq:
    return EmbedReq(
        identity=b"client",
        request=wire.EmbedRequest(rid, ["x"] * texts),
        input_ids=[[i] for i in range(texts)],
    )


def test_a_batch_takes_texts_from_every_queued_request_in_turn():
    big, small, mid = item("big", 10), item("small", 1), item("mid", 3)
    queue = [big, small, mid]
    first = take_texts(queue, 4)
    assert [(i.rid, i.part) for i in first] == [
        ("big", range(0, 2)),
        ("small", range(0, 1)),
        ("mid", range(0, 1)),
    ]
    assert list(queue) == [big, mid]  # small is complete; the others keep their places
    assert not big.complete and small.complete and big.started
    second = take_texts(queue, 4)
    assert [(i.rid, i.part) for i in second] == [("big", range(2, 4)), ("mid", range(1, 3))]
    assert list(queue) == [big] and mid.complete
    assert [i.part for i in take_texts(queue, 4)] == [range(4, 8)]
    assert [i.part for i in take_texts(queue, 4)] == [range(8, 10)]
    assert not queue and big.complete


@pytest.mark.parametrize("capacity", [1, 3, 32])
def test_every_text_is_taken_once_and_in_order(capacity):
    items = [item(f"r{k}", k) for k in (5, 1, 7, 2)]
    queue = list(items)
    taken: dict[str, list[int]] = {i.rid: [] for i in items}
    while queue:
        batch = take_texts(queue, capacity)
        assert 0 < sum(len(i.part) for i in batch) <= capacity
        for entry in batch:
            taken[entry.rid].extend(entry.part)
    assert taken == {i.rid: list(range(len(i.input_ids))) for i in items}
