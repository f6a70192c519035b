"""The launch's rendezvous address, parsed in one place for the supervisor and the workers.

``--dist-init-addr HOST:PORT`` names node 0's rendezvous (``MASTER_ADDR``, ``MASTER_PORT``); on a
single node without it, a free loopback port is picked. The supervisor plans its children with it
(``launcher._plan``); a worker without ``MASTER_*`` in its environment (the HTTP child) parses the
same flag with the same function. Standard library only.
"""

from __future__ import annotations

import socket


class RendezvousError(ValueError):
    """``--dist-init-addr`` is malformed or missing where it is needed; the message says the fix."""


def parse_dist_init_addr(dist_init_addr: str | None, nnodes: int) -> tuple[str, int] | None:
    """``(host, port)`` from ``--dist-init-addr HOST:PORT`` (``[v6]:PORT`` too); None when it is
    not given on a single node. Raises ``RendezvousError`` for a malformed address, or a missing
    one with ``nnodes > 1``. ``ServerArgs.check_server_args`` and ``master_address`` both use it."""
    if not dist_init_addr:
        if nnodes > 1:
            raise RendezvousError(
                f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT, the address of node 0 that "
                "every node can reach, the same on every node (e.g. --dist-init-addr 10.0.0.1:29500)"
            )
        return None
    host, sep, port = dist_init_addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousError(
            f"--dist-init-addr {dist_init_addr!r} is not HOST:PORT with a port in 1..65535; pass "
            "e.g. 10.0.0.1:29500 (the address of node 0 and a free port on it)"
        )
    return host, int(port)


def master_address(dist_init_addr: str | None, nnodes: int) -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)``: the parsed ``--dist-init-addr``, or, on one node without
    one, ``127.0.0.1`` and a free port. Raises ``RendezvousError`` as ``parse_dist_init_addr``."""
    given = parse_dist_init_addr(dist_init_addr, nnodes)
    if given is not None:
        return given
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]
