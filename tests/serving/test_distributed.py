"""The tensor-parallel group of one replica, formed by real processes over gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.e2e  # two interpreters import torch.distributed

JOIN = """
import json, os, sys
from serving.distributed import init_tp_group
import torch.distributed as dist

tp_rank = int(sys.argv[1])
init_tp_group("gloo", sys.argv[2], dp_rank=1, tp_rank=tp_rank, tp_size=2, timeout_s=120)
print(json.dumps({k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
                 | {"group_rank": dist.get_rank(), "group_size": dist.get_world_size()}))
# Neither rank leaves before both are connected: a rank that tears its group down at once can
# close its side while the other is still connecting its full mesh.
dist.barrier()
dist.destroy_process_group()
"""


def test_joining_a_group_keeps_local_rank_the_node_local_device_index(tmp_path):
    """Replica dp=1 of a tp=2 dp=2 launch on one node: its ranks are the node's local ranks 2 and
    3 (the plan's LOCAL_RANK, which names each process's device). After joining the group, RANK
    and WORLD_SIZE are the group's (transformers builds its tp mesh from them) and LOCAL_RANK is
    still 2 or 3: transformers binds the accelerator LOCAL_RANK names, so the group's own rank
    would put replica 1 on replica 0's devices."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN, str(tp_rank), str(tmp_path)],
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "RANK": str(2 + tp_rank),
                "LOCAL_RANK": str(2 + tp_rank),
                "WORLD_SIZE": "4",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tp_rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for tp_rank, (out, err) in enumerate(outs):
        assert procs[tp_rank].returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {
            "RANK": str(tp_rank),
            "LOCAL_RANK": str(2 + tp_rank),
            "WORLD_SIZE": "2",
            "group_rank": tp_rank,
            "group_size": 2,
        }
