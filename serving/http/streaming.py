"""How a route waits on a scheduler while its client may leave, and how it streams.

- ``unless_disconnected(receive, awaitable)``: the awaited result, or None when the client went
  away first (the wait is cancelled, which cancels the request at the scheduler);
- ``sse(data, event)``: one server-sent event, ``data`` as JSON;
- ``event_stream(replies, render, receive)``: the one way a route answers with
  ``text/event-stream`` (text generation and images both);
- ``merged(streams)``: several reply streams as one (a request of several choices), each reply
  with the index of its stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

import msgspec
from starlette.responses import Response, StreamingResponse

from serving.http.asgi import Receive
from serving.http.replica import SchedulerError
from serving.http.responses import error_body

T = TypeVar("T")
_json = msgspec.json.Encoder()


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, awaitable: Awaitable[T]) -> T | None:
    """Await ``awaitable`` in this task; if the client disconnects first, a watcher cancels this
    task (which cancels the request at the scheduler) and the result is None. The watcher is
    parked before the request goes out, so the HTTP child has nothing left to run while the
    scheduler computes, and the answer wakes this task directly."""
    task = asyncio.current_task()
    assert task is not None, "called from a task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _client_gone(receive)
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        return None
    finally:
        watcher.cancel()


def sse(data: object, event: str | None = None) -> bytes:
    """One server-sent event: an ``event: NAME`` line when ``event`` is given, then ``data:`` with
    ``data`` as JSON (``bytes`` go as they are, such as ``b"[DONE]"``)."""
    payload = data if isinstance(data, bytes) else _json.encode(data)
    named = b"event: " + event.encode("ascii") + b"\n" if event else b""
    return named + b"data: " + payload + b"\n\n"


class _End:
    """The end of a reply stream (``anext``'s default)."""


_END = _End()


async def event_stream(
    replies: AsyncGenerator[T, None],
    render: Callable[[T], Iterable[bytes]],
    receive: Receive,
    error_event: str | None = None,
) -> Response:
    """The one way a route streams (``text/event-stream``): the events ``render(reply)`` gives
    (``sse(...)``) for each reply of ``replies`` (``SchedulerClient.call``) in turn, then
    ``data: [DONE]``.

    The first reply is awaited before the response starts, so a request the scheduler refuses is
    still a plain JSON 4xx, and a client that leaves while waiting for it cancels the request (the
    answer is then a bare 499). A ``SchedulerError`` once streaming is one event of
    ``error_body`` (named ``error_event`` when given) before ``[DONE]``. Closing the stream early
    (the client went away) closes ``replies``, which cancels the request at the scheduler."""
    try:
        first = await unless_disconnected(receive, anext(replies, _END))
    except BaseException:
        await replies.aclose()
        raise
    if first is None:  # the client went away: the wait was cancelled, and with it the request
        await replies.aclose()
        return Response(status_code=499)

    async def events() -> AsyncIterator[bytes]:
        try:
            reply = first
            while not isinstance(reply, _End):
                for event in render(reply):
                    yield event
                try:
                    reply = await anext(replies, _END)
                except SchedulerError as exc:
                    yield sse(error_body(exc.status, exc.message, exc.param), error_event)
                    reply = _END
            yield sse(b"[DONE]")
        finally:
            await replies.aclose()

    return StreamingResponse(events(), media_type="text/event-stream")


async def merged(streams: list[AsyncGenerator[T, None]]) -> AsyncGenerator[tuple[int, T], None]:
    """``(i, reply)`` for each reply of ``streams[i]``, in the order they arrive, until every
    stream has ended. An exception from one stream (a ``SchedulerError``) is raised here; closing
    this generator early, or an exception, closes every stream (which cancels its request)."""
    arrived: asyncio.Queue[tuple[int, T | _End, BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async for reply in stream:
                arrived.put_nowait((i, reply, None))
            arrived.put_nowait((i, _END, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            arrived.put_nowait((i, _END, exc))

    pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            i, reply, failure = await arrived.get()
            if failure is not None:
                raise failure
            if isinstance(reply, _End):
                running -= 1
                continue
            yield i, reply
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
