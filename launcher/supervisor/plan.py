"""Which children one node's supervisor starts, and what each is told.

The launch has ``replica_ranks() * dp_size`` scheduler ranks in all (a replica's ranks are its
``--tp-size`` tensor-parallel ranks, or the two ranks of ``--enable-cfg-parallel``; tensor and data
parallelism span the nodes), split evenly: node ``node_rank`` of ``nnodes`` runs ``local = world /
nnodes`` of them, global ranks ``node_rank * local .. node_rank * local + local - 1``, each with
the torch.distributed environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and ``SCHEDULER_ENV_DEFAULTS`` where this
process's environment leaves them unset; node 0 also runs one HTTP child, unless
``http_target`` is empty (an engine that serves no HTTP). The rendezvous address is
``--dist-init-addr`` or, on a single node, a free loopback port (``launchspec.rendezvous``).

A replica that a reload or a scale starts while the launch runs (one node only) is planned by
``replica_specs`` from one of the launch's scheduler specs: replica ``dp`` has the ranks
``dp * per_replica ..`` and takes a group of devices (``LOCAL_RANK``) of its own, the one of the
replica it replaces.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.supervisor.watchdog import heartbeat_interval
from launchspec.rendezvous import RendezvousError, master_address

if TYPE_CHECKING:
    from bootstrap import ProcessSpec
    from launchspec.server_args import ServerArgs


# Set in every scheduler child whose environment leaves them unset. OpenMP's threads (torch's
# intra-op pool on the CPU) wait passively: a pool that spins on its cores for long takes them
# from the HTTP child, from other replicas and from other work on the machine, and stalls itself
# when one of its threads loses its core. But a pool that sleeps at once pays a wake-up for each
# of the hundreds of operators of a forward (a 135M model's decode step took 61 ms so, 35 ms
# without): GNU OpenMP's spin count keeps a waiting thread spinning for a short while (100,000
# turns, a few milliseconds) before it sleeps, which covers the gaps inside and between the
# forwards of a running batch and leaves an idle server asleep. They must be set before torch is
# imported, hence here and not in the worker.
SCHEDULER_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"}


class PlanError(ValueError):
    """The server arguments describe a launch that cannot be planned; the message says the fix."""


@dataclass(frozen=True)
class Endpoints:
    """The supervisor's own sockets, which every child is told about."""

    runtime_dir: str
    status: str  # PULL: bootstrap status messages
    ops: str  # PUB: ops events
    query: str  # REP: status snapshots


def plan_children(
    args: ServerArgs, *, payload: bytes, platform_key: str, runtime: str, endpoints: Endpoints
) -> list[ProcessSpec]:
    """The ``ProcessSpec`` of every child of this node, HTTP first when there is one."""
    from bootstrap import ProcessSpec
    from launchspec.compat import TABLE
    from launchspec.server_args import ARGS_CLASS
    from platforms import entrypoints

    entry_points = entrypoints.snapshot()  # read once here, adopted by every child
    aliases = TABLE.to_dict()

    per_replica = args.replica_ranks()
    world = per_replica * args.dp_size
    if world < 1 or args.nnodes < 1 or world % args.nnodes:
        raise PlanError(
            f"--tp-size {args.tp_size}"
            f"{' x 2 (--enable-cfg-parallel)' if per_replica != args.tp_size else ''} x "
            f"--dp-size {args.dp_size} = {world} ranks cannot be split "
            f"evenly over --nnodes {args.nnodes}; make the product a positive multiple of nnodes"
        )
    if not 0 <= args.node_rank < args.nnodes:
        raise PlanError(
            f"--node-rank {args.node_rank} must be in 0..{args.nnodes - 1} for --nnodes {args.nnodes}"
        )
    local = world // args.nnodes
    try:
        master_addr, master_port = master_address(args.dist_init_addr, args.nnodes)
    except RendezvousError as exc:
        raise PlanError(str(exc)) from None

    def spec(
        role: str, target: str, rank: int, local_rank: int, env: dict[str, str]
    ) -> ProcessSpec:
        return ProcessSpec(
            role=role,
            target=target,
            payload=payload,
            args_class=ARGS_CLASS,
            aliases=aliases,
            status_endpoint=endpoints.status,
            rank=rank,
            local_rank=local_rank,
            world_size=world,
            tp_size=per_replica,
            dp_size=args.dp_size,
            runtime=runtime,
            platform_key=platform_key,
            runtime_dir=endpoints.runtime_dir,
            ops_endpoint=endpoints.ops,
            query_endpoint=endpoints.query,
            env=env,
            log_level=args.log_level,
            entry_points=entry_points,
            heartbeat_interval=heartbeat_interval(args.watchdog_timeout),
            stop_marker=os.path.join(endpoints.runtime_dir, f"stop.{role}.{rank}")
            if endpoints.runtime_dir
            else "",
        )

    children = []
    if args.node_rank == 0 and args.http_target:
        children.append(spec("http", args.http_target, 0, 0, {}))
    for local_rank in range(local):
        rank = args.node_rank * local + local_rank
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local),
            "NODE_RANK": str(args.node_rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
        env.update({k: v for k, v in SCHEDULER_ENV_DEFAULTS.items() if k not in os.environ})
        assert args.scheduler_target, (
            "ServerArgs.__post_init__ fills in the runtime's worker target"
        )
        children.append(spec("scheduler", args.scheduler_target, rank, local_rank, env))
    return children


# A replica started while the launch runs carries this, so its tp group meets in a rendezvous
# file of its own (a dp rank can be used again after its earlier replica was stopped); the
# serving runtime reads the variable, and a replica restarted by healing sets it too.
INCARNATION_ENV = "SGLANG_LAUNCH_RESTART"


def replica_specs(
    template: ProcessSpec,
    dp_rank: int,
    device_group: int,
    *,
    payload: bytes,
    entry_points: tuple[tuple[str, str, str, str | None], ...] | None,
    dp_size: int,
    incarnation: str,
) -> list[ProcessSpec]:
    """The scheduler specs of replica ``dp_rank``, started while a one-node launch runs: the
    ranks ``dp_rank * tp_size + t`` on the devices ``device_group * tp_size + t``, with
    ``payload`` (the server arguments it serves), the ``entry_points`` its children adopt,
    ``dp_size`` replicas in the launch once it serves, and ``incarnation`` (unique in the launch)
    for a fresh tp rendezvous. Everything else is ``template``'s, a scheduler spec of the launch."""
    per_replica = max(template.tp_size, 1)
    marker_dir = os.path.dirname(template.stop_marker) if template.stop_marker else ""
    specs = []
    for tp_rank in range(per_replica):
        rank = dp_rank * per_replica + tp_rank
        local_rank = device_group * per_replica + tp_rank
        env = {
            **template.env,
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            INCARNATION_ENV: incarnation,
        }
        specs.append(
            dataclasses.replace(
                template,
                rank=rank,
                local_rank=local_rank,
                dp_size=dp_size,
                payload=payload,
                entry_points=entry_points,
                env=env,
                stop_marker=os.path.join(marker_dir, f"stop.scheduler.{rank}")
                if marker_dir
                else "",
            )
        )
    return specs
