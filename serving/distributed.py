"""The tensor-parallel group of one data-parallel replica, the launch's rendezvous store, and rank
0's broadcasts to its group.

On one node the ``tp_size`` ranks of replica ``dp_rank`` (its tensor-parallel ranks, or the
diffusion runtime's two ``--enable-cfg-parallel`` ranks) form their own ``torch.distributed``
world (transformers' tensor parallelism shards over the default group), rendezvousing through a
file store in the launch's private runtime directory: no port to pick, nothing reachable from
outside. Scheduler request sockets are ``ipc://`` paths in that directory too.

On several nodes (``nnodes > 1``) the rendezvous is node 0's ``--dist-init-addr`` (``MASTER_ADDR``,
``MASTER_PORT``): global scheduler rank 0 hosts one ``torch.distributed.TCPStore`` there for the
whole launch, and every process that needs it connects as a client. Each replica's tp group
initialises on a ``PrefixStore`` ``sglang-launch/tp/<dp>/`` of it (one port for every group, so
no two groups can collide), and a replica whose rank 0 runs on a node other than 0 binds its
request socket on TCP and announces the address under ``sglang-launch/scheduler/<dp>``, where
node 0's HTTP child reads it. Replicas whose rank 0 is on node 0 keep their ``ipc://`` socket.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed import Store, TCPStore

    from launchspec.server_args import ServerArgs

STORE_PREFIX = "sglang-launch/"

_store: TCPStore | None = None
_store_lock = threading.Lock()


def replica_node(dp_rank: int, tp_size: int, dp_size: int, nnodes: int) -> int:
    """The node that runs rank 0 of replica ``dp_rank`` (ranks are split evenly, in order)."""
    local = max(tp_size * dp_size // max(nnodes, 1), 1)
    return (dp_rank * tp_size) // local


def scheduler_key(dp_rank: int) -> str:
    """The store key under which a remote replica announces its request address."""
    return f"{STORE_PREFIX}scheduler/{dp_rank}"


def rendezvous_address(server_args: ServerArgs) -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)``: a scheduler's environment, else ``--dist-init-addr``."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and port.isdigit():
        return addr, int(port)
    from launchspec.rendezvous import master_address

    return master_address(server_args.dist_init_addr, server_args.nnodes)


def launch_store(server_args: ServerArgs, *, host: bool, timeout_s: float = 300.0) -> TCPStore:
    """This process's handle on the launch's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` (only
    with ``nnodes > 1``). ``host=True`` (global scheduler rank 0) serves it; the others connect,
    waiting up to ``timeout_s`` for the host to be up."""
    global _store
    with _store_lock:
        if _store is not None:
            return _store
        from torch.distributed import TCPStore

        addr, port = rendezvous_address(server_args)
        try:
            store = TCPStore(
                addr,
                port,
                is_master=host,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except Exception as exc:  # noqa: BLE001 - re-raised with the fix
            what = (
                (
                    f"cannot serve the launch's rendezvous store on port {port} (--dist-init-addr "
                    f"{addr}:{port}): is the port free on node 0?"
                )
                if host
                else (
                    f"cannot reach the launch's rendezvous store at {addr}:{port} (--dist-init-addr) "
                    f"within {timeout_s:.0f} s: is node 0 running and the address reachable from here?"
                )
            )
            raise RuntimeError(f"{what} ({type(exc).__name__}: {exc})") from exc
        _store = store
        return store


def advertised_host(master_addr: str, master_port: int) -> str:
    """This node's address on the route to node 0 (the interface node 0 can reach us through)."""
    infos = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)  # UDP: picks the route, sends nothing
        return str(probe.getsockname()[0])


class EndpointDirectory:
    """Node 0's HTTP child's view of the replicas' announced addresses (``lookup`` never blocks
    once connected; the first call connects to the store, waiting for its host)."""

    def __init__(self, server_args: ServerArgs, timeout_s: float = 300.0) -> None:
        self.server_args = server_args
        self.timeout_s = timeout_s

    def lookup(self, dp_rank: int) -> str | None:
        store = launch_store(self.server_args, host=False, timeout_s=self.timeout_s)
        key = scheduler_key(dp_rank)
        if not store.check([key]):
            return None
        return bytes(store.get(key)).decode()


def init_tp_group(
    backend: str,
    runtime_dir: str,
    dp_rank: int,
    tp_rank: int,
    tp_size: int,
    timeout_s: float = 300.0,
    store: Store | None = None,
    device_id: Any = None,
) -> None:
    """Join replica ``dp_rank``'s group on ``backend`` (the platform's distributed backend):
    through ``store`` (the launch's ``TCPStore``, several nodes) or a file store in
    ``runtime_dir`` (one node; a restarted replica's ranks, which carry ``SGLANG_LAUNCH_RESTART``,
    use a file of their own). ``device_id`` (a ``torch.device``; only where the platform's
    ``supports_distributed_device_id()``) binds the group to this rank's device."""
    import torch.distributed as dist

    bind = {} if device_id is None else {"device_id": device_id}

    # transformers reads these when it builds its device mesh: RANK and WORLD_SIZE within the
    # group, while LOCAL_RANK stays the launch's node-local rank, the index of this process's
    # device (transformers binds the accelerator LOCAL_RANK names; the group's rank would put
    # replica 1's ranks on replica 0's devices).
    os.environ.update(RANK=str(tp_rank), WORLD_SIZE=str(tp_size))
    if store is not None:
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(f"{STORE_PREFIX}tp/{dp_rank}/", store),
            rank=tp_rank,
            world_size=tp_size,
            timeout=timedelta(seconds=timeout_s),
            **bind,
        )
        return
    # A replica restarted by the supervisor meets in a fresh file: its killed ranks left theirs.
    restart = os.environ.get("SGLANG_LAUNCH_RESTART", "")
    path = Path(runtime_dir) / (
        f"tp-store-{dp_rank}.{restart}" if restart else f"tp-store-{dp_rank}"
    )
    dist.init_process_group(
        backend=backend,
        init_method=f"file://{path}",
        rank=tp_rank,
        world_size=tp_size,
        timeout=timedelta(seconds=timeout_s),
        **bind,
    )


def close_tp_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_bytes(data: bytes | None) -> bytes:
    """Rank 0 passes ``data``; every rank returns it (length first, then the bytes)."""
    import torch
    import torch.distributed as dist

    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    if data is not None:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    if buf.numel():
        dist.broadcast(buf, src=0)
    return buf.numpy().tobytes()


def broadcast_flags(flags: list[bool]) -> list[bool]:
    """Rank 0's per-sequence flags (e.g. cancelled) to every rank, once per decode step."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(flags, dtype=torch.uint8)
    dist.broadcast(t, src=0)
    return [bool(x) for x in t.tolist()]


def all_gather_tensor(tensor: Any) -> list[Any]:
    """Every rank's ``tensor`` (same shape and dtype on each), in rank order, on every rank."""
    import torch.distributed as dist

    tensor = tensor.contiguous()
    parts = [tensor.new_empty(tensor.shape) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return parts
