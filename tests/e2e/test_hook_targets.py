"""Every documented hook target carries real traffic, registered by SGLang's name where it has one.

The rows come from the "Common hook targets" tables of docs/plugins.md (SRT) and docs/diffusion.md
(images), so a row added there is tested here. One real plugin (a dist-info distribution on the
servers' ``PYTHONPATH``) registers an ``AROUND`` hook on every target of the tables, by the
row's SGLang name where it has one (else this project's); each hook appends
``target<TAB>pid`` to a log file and calls the original. A second plugin is the plugin system
spec's "Registration API" code block as written (its timer, ``AROUND`` on
``Scheduler.get_next_batch_to_run`` by both registration APIs, and its class ``REPLACE`` of
``Scheduler``), with the ``import time`` it needs.

Three servers run through the real CLI: the embedded default model (embeddings), a tiny causal
LM built at test time with ``--tp-size 2`` (generation), and a tiny diffusers pipeline with
``--enable-cfg-parallel`` (images, two ranks). A row that says it runs for every step, batch or
request logs again when a real request of the kinds it names goes through HTTP (both kinds when
it names both), and in every tensor-parallel rank when it says so; a start-up row has logged by
the time the server is ready, in the process it names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support import make_dist, wait_for
from support.serving import REPO, build_tiny_llama, post, server_env, start_server

pytestmark = pytest.mark.e2e  # every test here starts servers through the CLI


@dataclass(frozen=True)
class Row:
    """One documented target: SGLang's name (None when it has none), this project's, when it runs,
    and the runtime whose table lists it."""

    sglang: str | None
    ours: str
    runs: str
    runtime: str

    @property
    def target(self) -> str:
        """The name the observing plugin registers: SGLang's where it has one."""
        return self.sglang or self.ours


def documented_targets(doc: Path, heading: str, runtime: str) -> list[Row]:
    text = doc.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[1].startswith("`"):
            sglang = cells[0].strip("`") if cells[0].startswith("`") else None
            rows.append(Row(sglang, cells[1].strip("`"), cells[3], runtime))
    return rows


SRT = documented_targets(REPO / "docs" / "plugins.md", "### Common hook targets", "srt")
DIFFUSION = documented_targets(
    REPO / "docs" / "diffusion.md", "### Common hook targets for diffusion", "diffusion"
)

OBSERVER = """
import os

import hooks
import hooks.diffusion


def _observer(target):
    def observe(original_fn, *args, **kwargs):
        with open(os.environ["HOOK_TARGET_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{target}\\t{os.getpid()}\\n")
        return original_fn(*args, **kwargs)

    return observe


def register():
    for target in filter(None, os.environ.get("HOOK_TARGETS", "").split(",")):
        hooks.plugin_hook(target, type=hooks.HookType.AROUND)(_observer(target))


def register_diffusion():
    api = hooks.diffusion
    for target in filter(None, os.environ.get("DIFFUSION_HOOK_TARGETS", "").split(",")):
        api.plugin_hook(target, type=api.HookType.AROUND)(_observer(target))
"""

# The plugin system spec's "Registration API" block, as written (it uses ``time`` without
# importing it), and an entry point that does nothing: its hooks register at import.
SPEC_EXAMPLES = '''
import time

# --- Imperative API ---
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

def my_timer(original_fn, *args, **kwargs):
    start = time.perf_counter()
    result = original_fn(*args, **kwargs)
    print(f"Elapsed: {time.perf_counter() - start:.3f}s")
    return result

HookRegistry.register(
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    my_timer,
    HookType.AROUND,
)

# --- Decorator API ---
from sglang.srt.plugins.hook_registry import plugin_hook, HookType

@plugin_hook(
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    type=HookType.AROUND,
)
def my_timer(original_fn, *args, **kwargs):
    start = time.perf_counter()
    result = original_fn(*args, **kwargs)
    print(f"Elapsed: {time.perf_counter() - start:.3f}s")
    return result

# --- Class replacement (REPLACE) ---
from sglang.srt.plugins.hook_registry import plugin_hook, HookType
from sglang.srt.managers.scheduler import Scheduler

@plugin_hook(
    "sglang.srt.managers.scheduler.Scheduler",
    type=HookType.REPLACE,
)
class MyScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print("Enhanced scheduler initialized!")


def register():
    """The entry point (the hooks above registered when this module was imported)."""
'''


def test_the_tables_are_read():
    ours = {row.ours for row in SRT}
    assert "serving.srt.scheduler.Scheduler.process_batch_result" in ours
    assert len(SRT) >= 14 and all(row.runs for row in SRT + DIFFUSION)
    spec = {row.sglang for row in SRT}
    for name in ("get_next_batch_to_run", "run_batch", "process_batch_result", "__init__"):
        assert f"sglang.srt.managers.scheduler.Scheduler.{name}" in spec
    for name in ("__init__", "forward_batch_generation"):
        assert f"sglang.srt.managers.tp_worker.TpModelWorker.{name}" in spec
    assert "serving.diffusion.scheduler.DiffusionScheduler.process_batch_result" in {
        row.ours for row in DIFFUSION
    }


class Observed:
    """A running server with the observing plugins, and the log its hooks write."""

    def __init__(self, server, log: Path) -> None:
        self.server = server
        self.log = log

    def pids(self, target: str) -> list[int]:
        if not self.log.exists():
            return []
        lines = [line.split("\t") for line in self.log.read_text(encoding="utf-8").splitlines()]
        return [int(pid) for name, pid in lines if name == target]

    def lines(self, text: str) -> int:
        return self.server.log.count(text)


def _site(tmp: Path) -> Path:
    site = tmp / "site"
    make_dist(
        site,
        "observe-targets",
        {
            "sglang.srt.plugins": {"observe": "observe_targets:register"},
            "sglang.multimodal_gen.plugins": {"observe": "observe_targets:register_diffusion"},
        },
        {"observe_targets.py": OBSERVER},
    )
    make_dist(
        site,
        "spec-examples",
        {"sglang.srt.plugins": {"spec_examples": "spec_examples:register"}},
        {"spec_examples.py": SPEC_EXAMPLES},
    )
    return site


def _start(tmp: Path, name: str, args: list[str], rows: list[Row]) -> Observed:
    log = tmp / f"{name}-hooks.log"
    key = "DIFFUSION_HOOK_TARGETS" if rows is DIFFUSION else "HOOK_TARGETS"
    env = server_env(
        PYTHONPATH=str(_site(tmp)),
        HOOK_TARGET_LOG=str(log),
        **{key: ",".join(row.target for row in rows)},
    )
    return Observed(start_server(args, tmp, name, env=env), log)


@pytest.fixture(scope="module")
def embedding(tmp_path_factory):
    observed = _start(tmp_path_factory.mktemp("targets-embed"), "embed", [], SRT)
    yield observed
    observed.server.stop()


@pytest.fixture(scope="module")
def generation(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    tmp = tmp_path_factory.mktemp("targets-gen")
    model = build_tiny_llama(tmp / "tiny-llama", embedding_model_dir())
    observed = _start(tmp, "gen", ["--model-path", str(model), "--tp-size", "2"], SRT)
    yield observed
    observed.server.stop()


@pytest.fixture(scope="module")
def images(tiny_pipeline, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("targets-images")
    args = ["--runtime", "diffusion", "--model-path", str(tiny_pipeline), "--enable-cfg-parallel"]
    observed = _start(tmp, "images", args, DIFFUSION)
    yield observed
    observed.server.stop()


def _request(observed: Observed, kind: str) -> None:
    url = observed.server.url
    if kind == "generation":
        body = {"text": "hello there", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
        r = post(url + "/generate", body)
    elif kind == "embedding":
        r = post(url + "/v1/embeddings", {"input": "a cat sits on the mat"})
    else:
        body = {"prompt": "a photo of a cat", "size": "32x32", "num_inference_steps": 2}
        r = httpx.post(url + "/v1/images/generations", json=body, timeout=120)
    assert r.status_code == 200, r.text


def _kinds(row: Row) -> list[str]:
    """The kinds of request a per-request row names."""
    if row.runtime == "diffusion":
        return ["image"]
    runs = row.runs
    kinds = [k for k, word in (("generation", "generat"), ("embedding", "embed")) if word in runs]
    assert kinds, f"the 'runs' cell of {row.ours} says neither generation nor embeddings: {runs!r}"
    return kinds


def _sees_a_request(observed: Observed, row: Row, kind: str) -> None:
    """A request of ``kind`` runs ``row``'s hook (in every tensor-parallel rank where the row
    says so)."""
    before = len(observed.pids(row.target))
    _request(observed, kind)
    # The hook ran for this request: its process wrote again (the reply may beat the write).
    wait_for(
        lambda: len(observed.pids(row.target)) > before,
        60,
        f"{row.target} to be called for a {kind} request",
        interval=0.05,
    )
    if "every tensor-parallel rank" in row.runs:
        ranks = set(observed.pids("sglang.srt.managers.tp_worker.TpModelWorker.__init__"))
        assert len(ranks) == 2, ranks  # the generation server's two ranks
        wait_for(
            lambda: ranks <= set(observed.pids(row.target)[before:]),
            60,
            f"{row.target} to run in both tensor-parallel ranks",
            interval=0.05,
        )


@pytest.mark.parametrize(
    "row", SRT + DIFFUSION, ids=[f"{r.runtime}:{r.target}" for r in SRT + DIFFUSION]
)
def test_a_hook_on_each_documented_target_sees_real_traffic(row, embedding, generation, images):
    # The servers are module fixtures (started once, before the per-test process accounting).
    servers = {"generation": generation, "embedding": embedding, "image": images}
    if row.runs.startswith("for every"):
        for kind in _kinds(row):
            _sees_a_request(servers[kind], row, kind)
        return
    assert row.runs.startswith("at start-up"), (
        f"the table's 'runs' cell for {row.ours} is {row.runs!r}: say when it runs"
    )
    observed = images if row.runtime == "diffusion" else embedding
    if "of a generation model" in row.runs:
        observed = generation
    pids = observed.pids(row.target)
    assert pids, f"{row.target} did not run at start-up:\n{observed.server.log}"
    launcher = observed.server.proc.pid
    if "launching process" in row.runs:
        assert launcher in pids, (row.target, pids, launcher)
    if re.search(r"in (each|the) (scheduler|HTTP|worker|replica|image|rank)", row.runs):
        assert any(pid != launcher for pid in pids), (row.target, pids, launcher)
    if "every tensor-parallel rank" in row.runs or "each rank of" in row.runs:
        gen = generation if row.runtime == "srt" else images
        workers = {pid for pid in gen.pids(row.target) if pid != gen.server.proc.pid}
        assert len(workers) == 2, (row.target, workers)


@pytest.mark.parametrize("kind", ["generation", "embedding"])
def test_the_spec_examples_print_their_lines_in_the_launchers_output(kind, embedding, generation):
    observed = generation if kind == "generation" else embedding
    assert observed.lines("Enhanced scheduler initialized!") == 1, observed.server.log
    before = observed.lines("Elapsed: ")
    _request(observed, kind)
    # Both of the block's timers wrap every step: two lines at least per request.
    wait_for(
        lambda: observed.lines("Elapsed: ") >= before + 2,
        60,
        "the spec's timer to print for the request",
        interval=0.05,
    )
    assert re.search(r"^Elapsed: \d+\.\d{3}s$", observed.server.log, re.M), observed.server.log
