"""Limits that keep slow or stuck clients from piling up in the HTTP child.

- ``guarded_protocol(header_timeout, body_timeout, max_connections)``: uvicorn's httptools
  protocol with two deadlines per request: its headers must arrive within ``header_timeout``
  seconds of the connection (or of the request's first byte on a kept-alive connection), and its
  body within ``body_timeout`` seconds of the headers. A request that misses one gets
  ``408 Request Timeout`` and the connection is closed. (uvicorn itself only times out idle
  kept-alive connections.) It also applies the connection cap: while ``max_connections``
  connections are open (or as many requests run), a request gets a JSON ``503`` with
  ``Retry-After`` and its connection is closed, except the probes (``PROBES``: ``/health``, ``/ping``, ``/health_generate`` and
  ``/ready``), which are answered whatever the count, so a flood of connections cannot fail a
  liveness probe.
- ``RequestTimeout``: an ASGI wrapper answering ``504`` with a JSON error when the app has not
  answered a request within ``seconds``; the app's task is cancelled, which cancels the request at
  its scheduler. A streamed response that has started is ended where it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized

from serving.http.asgi import ASGIApp, Message, Receive, Scope, Send
from serving.http.responses import error_body

# Answered above the connection cap too.
PROBES = frozenset({"/health", "/ready", "/ping", "/health_generate"})
RETRY_AFTER_S = 1  # what a request refused at the cap is told to wait

_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 16\r\nconnection: close\r\n\r\nrequest timeout\n"
)


def guarded_protocol(header_timeout: float, body_timeout: float, max_connections: int = 0) -> type:
    """A uvicorn ``http`` protocol class enforcing the two deadlines (0 turns one off) and the
    connection cap (0: none; give uvicorn no ``limit_concurrency`` of its own)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _guard: asyncio.TimerHandle | None = None

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            if max_connections > 0:
                self.app = capped(self.app, max_connections, self.connections, self.tasks)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            if seconds > 0:
                self._guard = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._guard is not None:
                self._guard.cancel()
                self._guard = None

        def _expired(self) -> None:
            self._guard = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is None or not getattr(cycle, "response_started", False):
                self.transport.write(_408)
            if cycle is not None:
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_timeout)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._guard is None:  # the next request on a kept-alive connection
                self._arm(header_timeout)

        def on_headers_complete(self) -> None:
            self._arm(body_timeout)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol


def capped(app: ASGIApp, cap: int, connections: Sized, requests: Sized) -> ASGIApp:
    """``app`` behind the connection cap: with ``cap`` ``connections`` open, or more than
    ``cap`` ``requests`` running (this one included), a request for a route other than the
    ``PROBES`` gets a JSON 503 with ``Retry-After`` and ``connection: close``."""

    async def gate(scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and (len(connections) >= cap or len(requests) > cap)
            and scope["path"] not in PROBES
        ):
            body = error_body(
                503,
                f"the server is at its limit of {cap} connections (--max-connections); retry "
                f"in {RETRY_AFTER_S}s",
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", str(RETRY_AFTER_S).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return gate


class RequestTimeout:
    """ASGI wrapper: an HTTP request not answered within ``seconds`` gets a 504 JSON error."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracking_send), self.seconds)
        except TimeoutError:
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            body = error_body(
                504, f"the request was not answered within --request-timeout {self.seconds:g}s"
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 504,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
