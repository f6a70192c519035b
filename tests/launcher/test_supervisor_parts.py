"""The supervisor's parts and their decisions, with no process started.

- the modules of ``launcher.supervisor`` import each other without a loop (``TYPE_CHECKING`` and
  function-level imports counted), and healing, the replica set and the rollouts never import
  the launch they are part of;
- what becomes of a failed replica (``healing.judge``): a restart, taken out of service while
  others serve, excused during a stop, or the launch's end with a cause that says the restarts
  ran out (the cause it was given is left as it was);
- the restart policy left to its default follows the number of replicas; one given stays;
- where a reload or a scale goes next (``launcher.supervisor.steps``): which replica, which dp
  rank and device group, what a failed reload puts back, when it is done, whether replicas fit;
- a reload to a model that serves another kind is refused with both kinds and the way to force
  it (``revision.kind_change``, from the model directories' files);
- ``Healing`` driven through nothing but the callables it is handed: a replica that restarts
  and serves again settles ``healed(dp)`` (what a reload waits on, instead of polling), and one
  that fails past its restarts while others serve leaves, settling it too.
"""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest
from support import REPO

from bootstrap import ProcessSpec
from bootstrap.children import Child
from launcher.supervisor import steps
from launcher.supervisor.healing import EXCUSED, FATAL, RESTART, SET_ASIDE, Healing, judge
from launcher.supervisor.restarts import Restarts
from launcher.supervisor.state import WorkerState
from launcher.supervisor.workers import Worker
from launchspec import events
from launchspec.causes import ExitCode, RootCause
from launchspec.model_config import model_kind

SUPERVISOR = REPO / "launcher" / "supervisor"


# -- the import graph -------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """The ``launcher.supervisor`` modules ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "launcher.supervisor":
                found.update(f"launcher.supervisor.{a.name}" for a in node.names)
            elif node.module.startswith("launcher.supervisor."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("launcher.supervisor."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {f"launcher.supervisor.{p.stem}": p for p in SUPERVISOR.glob("*.py")}
    modules.pop("launcher.supervisor.__init__")
    return {name: _imports(path) & set(modules) for name, path in modules.items()}


def test_the_supervisor_modules_import_each_other_without_a_loop():
    graph = _graph()
    loops = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            loops.append(path[path.index(name) :] + [name])
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert loops == [], "\n".join(" -> ".join(loop) for loop in loops)


def test_the_parts_of_a_launch_never_import_the_launch():
    graph = _graph()
    for part in ("healing", "replicas", "rollout", "steps", "revision", "restarts", "workers"):
        imported = graph[f"launcher.supervisor.{part}"]
        assert not imported & {"launcher.supervisor.launch", "launcher.supervisor.supervisor"}, (
            part,
            imported,
        )


# -- what becomes of a failure ----------------------------------------------------------------------
def _cause(hint: str | None = None) -> RootCause:
    return RootCause("scheduler.1 exited", ExitCode.WORKER_FAILED, worker="scheduler.1", hint=hint)


def test_a_failure_the_policy_allows_is_a_restart_and_counts():
    restarts = Restarts("on-failure", max_restarts=2, backoff=0.5)
    verdict = judge(_cause(), 1, restarts, stop_requested=False, others_serve=True)
    assert verdict.action == RESTART and verdict.launch_goes_on
    assert verdict.decision is not None and (verdict.decision.attempt, verdict.decision.delay) == (
        1,
        0.5,
    )
    assert restarts.count(1) == 1


def test_past_its_restarts_a_replica_leaves_while_others_serve_else_the_launch_ends():
    restarts = Restarts("on-failure", max_restarts=0, backoff=0.5)
    cause = _cause(hint="look at the worker's log")
    aside = judge(cause, 1, restarts, stop_requested=False, others_serve=True)
    assert aside.action == SET_ASIDE and aside.launch_goes_on and aside.cause is cause

    last = judge(cause, 1, restarts, stop_requested=False, others_serve=False)
    assert last.action == FATAL and not last.launch_goes_on
    assert last.cause.exit_code == ExitCode.WORKER_DIED  # the server was ready before
    assert last.cause.hint == (
        "look at the worker's log; scheduler dp=1 was restarted 0 time(s) already "
        "(--max-restarts 0)"
    )
    # The cause it was given is left as it was: the verdict carries its own.
    assert (cause.exit_code, cause.hint) == (ExitCode.WORKER_FAILED, "look at the worker's log")


def test_a_failure_no_policy_restarts_ends_the_launch_as_it_came():
    cause = _cause()
    never = judge(cause, 0, Restarts("never", 3, 0.1), stop_requested=False, others_serve=True)
    assert never.action == FATAL and never.cause is cause
    http = judge(
        cause, None, Restarts("on-failure", 3, 0.1), stop_requested=False, others_serve=True
    )
    assert http.action == FATAL and http.decision is None


def test_during_a_stop_nothing_restarts_and_a_healable_failure_is_excused():
    restarts = Restarts("on-failure", max_restarts=1, backoff=0.1)
    excused = judge(_cause(), 1, restarts, stop_requested=True, others_serve=True)
    assert excused.action == EXCUSED and excused.launch_goes_on
    assert restarts.count(1) == 0  # nothing was restarted, nothing counted
    never = Restarts("never", 1, 0.1)
    assert judge(_cause(), 1, never, stop_requested=True, others_serve=True).action == FATAL


def test_a_default_policy_follows_the_number_of_replicas_and_a_given_one_stays():
    default = Restarts("never", 3, 0.1, follows_replicas=True)
    assert default.follow(3) == "on-failure" and default.policy == "on-failure"
    assert default.follow(1) == "never"
    given = Restarts("never", 3, 0.1)
    assert given.follow(3) == "never"


# -- where a change goes next -----------------------------------------------------------------------
def test_a_reload_beside_the_old_replicas_replaces_each_once_in_order():
    layout = steps.Layout(in_service=[0, 1], groups={0: 0, 1: 1})
    order, done, plan = [0, 1], [], []
    while (old := steps.next_to_replace(order, done, layout.in_service)) is not None:
        step = steps.replacement(old, layout, surge=1)
        plan.append(step)
        # The successor serves, then the old one is gone and its dp rank is free again.
        layout.groups[step.new] = step.group
        layout.in_service = sorted({*layout.in_service, step.new} - {old})
        del layout.groups[old]
        done.append(old)
    assert plan == [
        steps.Replace(old=0, new=2, group=0, in_place=False),  # dp=2 starts on dp=0's devices
        steps.Replace(old=1, new=0, group=1, in_place=False),  # dp=0 is free again by then
    ]
    assert layout.in_service == [0, 2]


def test_a_reload_in_place_keeps_each_dp_rank_and_skips_a_replica_that_left():
    layout = steps.Layout(in_service=[0, 1, 2], groups={0: 0, 1: 1, 2: 2})
    assert steps.replacement(1, layout, surge=0) == steps.Replace(1, 1, 1, in_place=True)
    # dp=1 was taken out of service while the reload replaced dp=0: dp=2 is next, then done.
    assert steps.next_to_replace([0, 1, 2], [0], [0, 2]) == 2
    assert steps.next_to_replace([0, 1, 2], [0, 2], [0, 2]) is None


def test_a_failed_reload_starts_what_it_left_out_then_replaces_back_what_it_replaced():
    assert steps.rollback_steps([2, 0], (1, 1)) == [
        steps.Rejoin(dp=1, group=1),
        steps.ReplaceBack(dp=2),
        steps.ReplaceBack(dp=0),
    ]
    assert steps.rollback_steps([], None) == []


def test_a_scale_adds_on_the_lowest_free_slots_and_removes_the_newest_first():
    layout = steps.Layout(in_service=[0, 2], busy={1}, groups={0: 0, 1: 3, 2: 1})
    assert steps.scale_step(layout, 3) == steps.Add(dp=3, group=2)  # dp=1 is busy retiring
    layout = steps.Layout(
        in_service=[0, 1, 2], groups={0: 0, 1: 1, 2: 2}, serving_since={0: 0, 1: 2, 2: 1}
    )
    assert steps.scale_step(layout, 1) == steps.Remove(dp=1)  # it joined last
    assert steps.scale_step(layout, 3) is None


def test_replicas_that_need_more_devices_than_the_schedulers_see_are_named_with_the_fix():
    layout = steps.Layout(in_service=[0, 1], groups={0: 0, 1: 1})
    assert steps.devices_short(layout, 2, 2, visible=4) is None
    short = steps.devices_short(layout, 3, 2, visible=4)
    assert short is not None and short.startswith("--dp-size 3 needs devices 0-5 on this node")
    assert "its schedulers see 4; scale to at most 2" in short


# -- the model's kind -------------------------------------------------------------------------------
def _model(folder: Path, architecture: str | None) -> Path:
    folder.mkdir(parents=True)
    config = {"architectures": [architecture]} if architecture else {}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_kind_of_a_model_comes_from_its_files(tmp_path):
    assert model_kind(_model(tmp_path / "llama", "LlamaForCausalLM")) == "generation"
    assert model_kind(_model(tmp_path / "gpt2", "GPT2LMHeadModel")) == "generation"
    assert model_kind(_model(tmp_path / "bert", "BertModel")) == "embedding"
    assert model_kind(_model(tmp_path / "bare", None)) == "embedding"
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "model_index.json").write_text('{"_class_name": "X"}')
    assert model_kind(tmp_path / "pipe") == "image"
    assert model_kind(tmp_path / "nothing") is None


def test_a_reload_to_another_kind_is_refused_naming_both_and_how_to_force_it(tmp_path):
    from launcher.supervisor.revision import Revision, kind_change
    from launchspec.server_args import ServerArgs

    def revision(path: Path) -> Revision:
        return Revision(ServerArgs(model_path=str(path)), b"", None)

    embedder = revision(_model(tmp_path / "minilm", "BertModel"))
    llama = revision(_model(tmp_path / "llama", "LlamaForCausalLM"))
    other = revision(_model(tmp_path / "e5", "XLMRobertaModel"))
    problem = kind_change(embedder, llama)
    assert problem is not None
    assert f"from embedding ({tmp_path / 'minilm'}) to generation ({tmp_path / 'llama'})" in (
        problem
    )
    assert "--allow-kind-change" in problem and "allow_kind_change=True" in problem
    assert kind_change(embedder, other) is None  # the same kind: nothing changes for clients
    unknown = Revision(ServerArgs(model_path=str(tmp_path / "absent")), b"", None)
    assert unknown.kind is None and kind_change(unknown, llama) is None


# -- Healing through its doors ----------------------------------------------------------------------
def _replica(dp: int, tp: int = 2) -> list[Worker]:
    workers = []
    for t in range(tp):
        rank = dp * tp + t
        spec = ProcessSpec(
            role="scheduler",
            target="x.y",
            payload=b"",
            status_endpoint="",
            args_class="",
            rank=rank,
            tp_size=tp,
            dp_size=2,
        )
        state = WorkerState("scheduler", rank, rank, 0, pid=1000 + rank, ready=True)
        workers.append(Worker(Child(spec), state))
    return workers


class Doors:
    """What Healing is handed: plain callables over two replicas of plain records."""

    def __init__(self) -> None:
        self.workers = _replica(0) + _replica(1)
        self.published: list[events.Event] = []
        self.failures: list[RootCause] = []
        self.ended: list[list[str]] = []
        self.spawned: list[tuple[str, int]] = []
        self.set_aside: list[int] = []
        self.in_service = [0, 1]

    def ranks(self, dp: int) -> list[Worker]:
        return [w for w in self.workers if w.dp_rank == dp]

    def healing(self, restarts: Restarts) -> Healing:
        async def end_at_once(workers, *, because_of, restart=False):
            self.ended.append([w.name for w in workers])

        def spawn_again(worker, attempt, cause):
            worker.state.ready = False
            self.spawned.append((worker.name, attempt))

        def set_aside(dp, cause, reason):
            self.set_aside.append(dp)
            self.in_service.remove(dp)
            return asyncio.ensure_future(asyncio.sleep(0))

        return Healing(
            restarts,
            60.0,
            publish=self.published.append,
            fail=self.failures.append,
            worker_named=lambda name: next((w for w in self.workers if w.name == name), None),
            ranks=self.ranks,
            end_at_once=end_at_once,
            spawn_again=spawn_again,
            in_service=lambda: list(self.in_service),
            set_aside=set_aside,
        )


def test_a_restarted_replica_that_serves_again_settles_what_waits_for_it():
    async def scenario() -> None:
        doors = Doors()
        healing = doors.healing(Restarts("on-failure", max_restarts=3, backoff=0.0))
        await asyncio.wait_for(healing.healed(1), 1)  # not restarting: at once

        cause = RootCause("scheduler.2 died", worker="scheduler.2", pid=1002)
        verdict = healing.handle_failure(cause, stop_requested=False)
        assert verdict.action == RESTART and healing.restarting() == [1]
        waiter = asyncio.ensure_future(healing.healed(1))
        await asyncio.sleep(0.05)  # the restart ends the replica and spawns its ranks again
        assert doors.ended == [["scheduler.2", "scheduler.3"]]
        assert doors.spawned == [("scheduler.2", 1), ("scheduler.3", 1)]
        assert not waiter.done()

        first, second = doors.ranks(1)
        first.state.ready = True
        healing.rank_ready(first)
        assert not waiter.done()  # a replica serves once every one of its ranks is ready
        second.state.ready = True
        healing.rank_ready(second)
        await asyncio.wait_for(waiter, 1)
        assert healing.restarting() == []
        (ready,) = [e for e in doors.published if isinstance(e, events.ReplicaReady)]
        assert (ready.dp_rank, ready.attempt) == (1, 1)
        assert doors.failures == []

    asyncio.run(scenario())


def test_a_replica_that_fails_again_past_its_restarts_leaves_and_is_no_longer_restarting():
    async def scenario() -> None:
        doors = Doors()
        healing = doors.healing(Restarts("on-failure", max_restarts=1, backoff=0.0))
        cause = RootCause("scheduler.2 died", worker="scheduler.2", pid=1002)
        assert healing.handle_failure(cause, stop_requested=False).action == RESTART
        waiter = asyncio.ensure_future(healing.healed(1))
        await asyncio.sleep(0.05)
        # Its restarted ranks fail while starting: restarts used, dp=0 serves, so it leaves.
        again = RootCause("scheduler.3 failed", worker="scheduler.3", pid=1003)
        verdict = healing.handle_failure(again, stop_requested=False)
        assert verdict.action == SET_ASIDE and doors.set_aside == [1]
        await asyncio.wait_for(waiter, 1)  # whoever waited for it goes on
        assert healing.restarting() == []  # a reload or a scale is no longer refused for it
        assert healing.is_stale(RootCause("late news", worker="scheduler.2", pid=1002))

    asyncio.run(scenario())


@pytest.mark.parametrize("stop_requested", [False, True])
def test_the_last_replica_past_its_restarts_ends_the_launch(stop_requested):
    async def scenario() -> None:
        doors = Doors()
        doors.in_service = [1]
        healing = doors.healing(Restarts("on-failure", max_restarts=0, backoff=0.0))
        cause = RootCause("scheduler.2 died", worker="scheduler.2", pid=1002)
        verdict = healing.handle_failure(cause, stop_requested=stop_requested)
        assert verdict.action == FATAL and doors.set_aside == [] and doors.spawned == []

    asyncio.run(scenario())
