"""Two supervisors on loopback form one launch: ``--nnodes 2``, ``--node-rank 0/1``.

``--tp-size 2`` over two nodes is one scheduler rank per node (global ranks 0 and 1); node 0 also
runs the HTTP child. Each rank joins one torch.distributed process group with the platform's
backend (gloo on the CPU platform) at the shared ``--dist-init-addr`` and all-reduces rank + 1:
both must report 1 + 2 = 3.
"""

from __future__ import annotations

import os
import signal

import pytest
from support import free_port
from support.supervisor import FAST, READY_WAIT, Run, short_runtime_dir

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes


def test_two_nodes_form_one_process_group():
    addr = f"127.0.0.1:{free_port()}"
    common = [
        *FAST,
        "--nnodes",
        "2",
        "--tp-size",
        "2",
        "--dist-init-addr",
        addr,
        "--scheduler-target",
        "support.supervisor.allreduce_worker",
        "--http-target",
        READY_WAIT,
    ]
    env = {"SGLANG_USE_CPU_ENGINE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    runtime_dir = short_runtime_dir()
    with (
        Run(
            [*common, "--node-rank", "0", "--port", str(free_port())],
            env=env,
            runtime_dir=runtime_dir,
        ) as node0,
        Run([*common, "--node-rank", "1"], env=env, runtime_dir=runtime_dir) as node1,
    ):
        snap0, snap1 = node0.wait_ready(180), node1.wait_ready(180)

        assert [w["name"] for w in snap0["workers"]] == ["http.0", "scheduler.0"]
        assert [w["name"] for w in snap1["workers"]] == ["scheduler.1"]
        assert snap0["url"] and snap1["url"] is None
        ranks = [w for snap in (snap0, snap1) for w in snap["workers"] if w["role"] == "scheduler"]
        assert [(w["info"]["rank"], w["info"]["world_size"]) for w in ranks] == [(0, 2), (1, 2)]
        assert {w["info"]["backend"] for w in ranks} == {"gloo"}
        assert [w["info"]["sum"] for w in ranks] == [3.0, 3.0]
        assert snap0["platform"] == snap1["platform"] == "builtin:cpu"
        assert "node 1 ready" in node1.stderr

        for run in (node0, node1):
            os.kill(run.pid, signal.SIGTERM)
        assert node0.wait(60) == 0, node0
        assert node1.wait(60) == 0, node1
        node0.assert_nothing_left()
        node1.assert_nothing_left()
