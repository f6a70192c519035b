"""The ops client side: find a running launcher and ask it for its state or its events, or to
change (reload, scale).

Used by ``sglang-launch status``, ``events``, ``reload`` and ``scale``. Every request has a deadline and
every socket is closed without lingering, so a launcher that vanished mid-question makes the
command fail with a message, never hang.
"""

from __future__ import annotations

import json

import zmq

from launcher.supervisor.rundir import find_launcher

__all__ = ["QueryError", "QueryRefused", "find_launcher", "query"]


class QueryError(RuntimeError):
    """The launcher did not answer, or answered with an error."""


class QueryRefused(QueryError):
    """The launcher understood the request and refused it (a reload or a scale it cannot make
    now); the message is its reason."""


def query(
    endpoint: str,
    request: dict[str, object],
    timeout: float = 5.0,
    zctx: zmq.Context[zmq.Socket[bytes]] | None = None,
) -> dict[str, object]:
    """Send one request to a launcher's query socket and return its (``ok``) reply, a JSON
    object (``launcher.supervisor.ops`` describes the queries and their replies)."""
    zctx = zctx or zmq.Context.instance()
    sock = zctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(json.dumps(request).encode())
        if not sock.poll(int(timeout * 1000)):
            raise QueryError(
                f"the launcher did not answer within {timeout:g}s at {endpoint}; it may be "
                "stopping or stuck (retry, or raise --timeout)"
            )
        reply = json.loads(sock.recv())
    finally:
        sock.close()
    if not isinstance(reply, dict) or not reply.get("ok"):
        error = reply.get("error") if isinstance(reply, dict) else reply
        if isinstance(reply, dict) and reply.get("refused") is True:
            raise QueryRefused(str(error))
        raise QueryError(f"the launcher refused the query: {error}")
    answer: dict[str, object] = reply
    return answer
