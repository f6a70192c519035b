"""Every documented hook target carries real traffic.

The rows come from the "Common hook targets" table of docs/plugins.md, so a row added there is
tested here. One real plugin (a dist-info distribution on the servers' ``PYTHONPATH``) registers
an ``AROUND`` hook on every target of the table; each hook appends ``target<TAB>pid`` to a log
file and calls the original. Two servers run through the real CLI: the embedded default model
(embeddings) and a tiny causal LM built at test time (generation). A row that says it runs for
every batch must log again when a real request goes through HTTP; a start-up row must have
logged by the time the server is ready, in the process the table names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import make_dist, wait_for
from support.serving import REPO, build_tiny_llama, post, server_env, start_server

pytestmark = pytest.mark.e2e  # every test here starts servers through the CLI

DOC = REPO / "docs" / "plugins.md"


def documented_targets() -> list[tuple[str, str]]:
    """``(target, when it runs)`` for every row of the doc's common-hook-target table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Common hook targets", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[2]))
    return rows


TARGETS = documented_targets()

PLUGIN = """
import os

from hooks import HookType, plugin_hook


def _observer(target):
    def observe(original_fn, *args, **kwargs):
        with open(os.environ["HOOK_TARGET_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{target}\\t{os.getpid()}\\n")
        return original_fn(*args, **kwargs)

    return observe


def register():
    for target in os.environ["HOOK_TARGETS"].split(","):
        plugin_hook(target, type=HookType.AROUND)(_observer(target))
"""


def test_the_table_is_read():
    targets = [t for t, _ in TARGETS]
    assert len(targets) >= 10 and "serving.srt.model_runner.ModelRunner.embed_matrix" in targets
    assert all(when for _, when in TARGETS)


class Observed:
    """A running server with the observing plugin, and the log its hooks write."""

    def __init__(self, server, log: Path) -> None:
        self.server = server
        self.log = log

    def pids(self, target: str) -> list[int]:
        if not self.log.exists():
            return []
        lines = [line.split("\t") for line in self.log.read_text(encoding="utf-8").splitlines()]
        return [int(pid) for name, pid in lines if name == target]


def _start(tmp: Path, name: str, args: list[str]) -> Observed:
    site = tmp / "site"
    if not site.exists():
        make_dist(
            site,
            "observe-targets",
            {"sglang.srt.plugins": {"observe": "observe_targets:register"}},
            {"observe_targets.py": PLUGIN},
        )
    log = tmp / f"{name}-hooks.log"
    env = server_env(
        PYTHONPATH=str(site), HOOK_TARGET_LOG=str(log), HOOK_TARGETS=",".join(t for t, _ in TARGETS)
    )
    return Observed(start_server(args, tmp, name, env=env), log)


@pytest.fixture(scope="module")
def embedding(tmp_path_factory):
    observed = _start(tmp_path_factory.mktemp("targets-embed"), "embed", [])
    yield observed
    observed.server.stop()


@pytest.fixture(scope="module")
def generation(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    tmp = tmp_path_factory.mktemp("targets-gen")
    model = build_tiny_llama(tmp / "tiny-llama", embedding_model_dir())
    observed = _start(tmp, "gen", ["--model-path", str(model)])
    yield observed
    observed.server.stop()


def _request(observed: Observed, kind: str) -> None:
    url = observed.server.url
    if kind == "generation":
        r = post(
            url + "/generate",
            {"text": "hello there", "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        )
    else:
        r = post(url + "/v1/embeddings", {"input": "a cat sits on the mat"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("target, when", TARGETS, ids=[t for t, _ in TARGETS])
def test_a_hook_on_each_documented_target_sees_real_traffic(target, when, embedding, generation):
    # Both servers are module fixtures (started once, before the per-test process accounting).
    if when.startswith("for every"):
        kind = "generation" if "generation" in when else "embedding"
        observed = generation if kind == "generation" else embedding
        before = len(observed.pids(target))
        _request(observed, kind)
        # The hook ran for this request: its process wrote again (the reply may beat the write).
        wait_for(
            lambda: len(observed.pids(target)) > before,
            60,
            f"{target} to be called for a request",
            interval=0.05,
        )
        return
    assert when.startswith("at start-up"), (
        f"the table's 'Runs' cell for {target} is {when!r}: say when it runs"
    )
    observed = embedding
    pids = observed.pids(target)
    assert pids, f"{target} did not run at start-up:\n{observed.server.log}"
    launcher = observed.server.proc.pid
    if "launching process" in when:
        assert launcher in pids, (target, pids, launcher)
    workers = re.search(r"in (each|the) (scheduler|HTTP|worker|replica)", when)
    if workers:
        assert any(pid != launcher for pid in pids), (target, pids, launcher)
