"""Mistakes fail fast and quietly, and the terminal stays readable.

Every case runs the real ``sglang-launch`` (``python -m launcher``) as a process of its own:

- a busy HTTP port, and an encoder model with ``--tp-size 2`` (the embedded default model, read
  from its real config.json), end with exit 2 before any worker is spawned;
- when a worker fails, a worker still starting is killed at once (it ignores SIGTERM here, and
  the grace period is longer than the test waits), labelled "stopped", and the failure's
  traceback is printed once;
- ``--help`` of every command imports no torch;
- on a pseudo-terminal, the workers' own lines appear above the live table, each once, and the
  table is drawn once (the byte stream is replayed through the ``pyte`` terminal emulator);
  without a terminal no escape sequence is written;
- the embedded ``Launcher`` (in this process, in ``fresh_process``) names settings the way its
  API spells them.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys

import psutil
import pytest
from support import REPO, clean_env, free_port, run_python, wait_for
from support.supervisor import FAST, READY_WAIT, TESTS, Run, short_runtime_dir

pytestmark = pytest.mark.e2e

TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture
def busy_port():
    """A loopback port another process (this one) is listening on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_busy_port_exits_2_naming_the_port_and_the_fix_before_any_worker(busy_port):
    with Run([*FAST, "--port", str(busy_port), "--scheduler-target", READY_WAIT]) as run:
        assert run.wait(60) == 2, run
        err = run.stderr
        assert f"--port {busy_port} is already in use on 127.0.0.1" in err, run
        assert "pass --port N with a free port, or stop the process that holds" in err, run
        assert "starting" not in err and "spawned" not in err, run
        assert TRACEBACK not in err, run
        run.assert_nothing_left()


def test_address_of_another_machine_exits_2_naming_the_host():
    with Run([*FAST, "--host", "192.0.2.1", "--port", str(free_port())]) as run:  # TEST-NET-1
        assert run.wait(60) == 2, run
        assert "--host '192.0.2.1' is not an address of this machine" in run.stderr, run
        assert "starting" not in run.stderr, run


def test_encoder_with_tp_size_2_exits_2_from_its_config_before_any_worker():
    # The embedded embedding model, a BERT encoder installed by the serve extra.
    with Run(
        [*FAST, "--model-path", "all-MiniLM-L6-v2", "--tp-size", "2", "--port", str(free_port())],
        env={"SGLANG_USE_CPU_ENGINE": "1"},
    ) as run:
        assert run.wait(60) == 2, run
        err = run.stderr
        assert "--tp-size 2 needs a causal LM" in err and "BertModel encoder" in err, run
        assert "serve it with --tp-size 1 and scale out with --dp-size 2" in err, run
        assert "starting" not in err and "spawned" not in err, run
        assert TRACEBACK not in err, run
        run.assert_nothing_left()


def test_a_failure_stops_workers_still_starting_at_once_and_prints_one_traceback(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    # scheduler.0 never gets ready and ignores SIGTERM; a grace period would keep it for 600 s.
    args = [
        "--startup-timeout",
        "120",
        "--stop-grace-period",
        "600",
        "--tp-size",
        "2",
        "--scheduler-target",
        "support.workers.fail_on_last_rank",
        "--http-target",
        READY_WAIT,
    ]
    with Run(args, env={"TESTWORKER_RANKS_DIR": str(markers)}) as run:
        assert run.wait(120) == 1, run
        err = run.stderr
        block = err.split("=" * 72)[1]
        assert "worker:     scheduler.1 (pid" in block and block.count(TRACEBACK) == 1, run
        assert err.count(TRACEBACK) == 1, f"one traceback, under the root cause\n{run}"
        assert "the last rank failed on purpose" in block, run
        assert re.search(r"scheduler\.0 \(pid \d+\) stopped", err), run
        assert not re.search(r"scheduler\.0 .*failed", err), run
        assert "http.0" in err and not re.search(r"http\.0 .*failed", err), run
        run.assert_nothing_left()


HELP_DRIVER = r"""
import contextlib, io, json, sys
from launcher.cli import main
argv = json.loads(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
print("RESULT:" + json.dumps({"heavy": heavy, "help": len(out.getvalue())}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-h"],
        ["serve", "--help"],
        ["--runtime", "diffusion", "--help"],
        ["plugins", "--help"],
        ["status", "--help"],
        ["events", "--help"],
        ["check-platform", "--help"],
    ],
)
def test_help_imports_no_torch(argv):
    # No SGLANG_USE_CPU_ENGINE: a platform selection here would probe CUDA through torch.
    result = run_python(HELP_DRIVER, args=[json.dumps(argv)])
    assert result.returncode == 0, result
    assert result.data["help"] > 200, result  # the options were printed
    assert result.data["heavy"] == [], f"--help imported {result.data['heavy']}\n{result}"


# ------------------------------------------------------------------ the terminal
CHATTY = "support.workers.chatty_ready"
LINES = 6


def _launch_env(tag_dir: str) -> dict[str, str]:
    env = clean_env(TESTWORKER_LINES=str(LINES))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS)])
    env["XDG_RUNTIME_DIR"] = tag_dir
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _chatty_args() -> list[str]:
    return [
        *FAST,
        "--tp-size",
        "2",
        "--port",
        str(free_port()),
        "--scheduler-target",
        CHATTY,
        "--http-target",
        CHATTY,
    ]


def _kill(proc: subprocess.Popen) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(10)


def _run_on_pty(width: int, stdout=None) -> bytes:
    """A chatty launch with the pseudo-terminal as stdin and stderr (and stdout, unless given):
    waits for ready, SIGTERMs it, waits for its exit (0); returns what the terminal received."""
    import fcntl
    import struct
    import termios

    main, secondary = pty.openpty()
    os.set_blocking(main, False)
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 200, width, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *_chatty_args()],
        stdin=secondary,
        stdout=secondary if stdout is None else stdout,
        stderr=secondary,
        env=_launch_env(short_runtime_dir()),
        cwd=str(REPO),
        start_new_session=True,
    )
    os.close(secondary)
    stream = bytearray()

    def read() -> None:
        while select.select([main], [], [], 0.05)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every holder of the terminal is gone
                return
            if not chunk:
                return
            stream.extend(chunk)

    def seen(text: bytes):
        def check() -> bool:
            read()
            if proc.poll() is not None and text not in stream:
                raise AssertionError(
                    f"the launcher exited ({proc.returncode}):\n{stream.decode(errors='replace')}"
                )
            return text in stream

        return check

    try:
        wait_for(seen(b" ready at http://"), 120, "the ready line on the terminal")
        proc.send_signal(signal.SIGTERM)
        wait_for(seen(b"every worker process is gone"), 60, "the launch to stop")
        assert proc.wait(30) == 0
        read()
    finally:
        if proc.poll() is None:
            _kill(proc)
        os.close(main)
    return bytes(stream)


def test_on_a_terminal_worker_lines_go_above_the_live_table():
    import pyte

    width = 160
    stream = _run_on_pty(width)
    screen = pyte.Screen(width, 400)
    byte_stream = pyte.ByteStream(screen)
    byte_stream.feed(stream.replace(b"\n", b"\r\n") if b"\r\n" not in stream else stream)
    shown = [line.rstrip() for line in screen.display]
    text = "\n".join(shown)
    for worker in ("http.0", "scheduler.0", "scheduler.1"):
        for i in range(LINES):
            line = f"log line {i} of {worker}"
            assert shown.count(line) == 1, f"{line!r} must appear once, intact\n{text}"
        rows = [s for s in shown if s.startswith(f"  {worker} ")]
        assert len(rows) == 1, f"one row of the table for {worker} (no stale copies)\n{text}"
        assert "ready" in rows[0], text
    # The table (its last row) stands after every line the workers wrote before they were ready,
    # and the ready line right below it.
    last_row = max(i for i, s in enumerate(shown) if s.startswith("  scheduler.1 "))
    assert shown[last_row + 1].startswith("sglang-launch: ready at http://"), text
    # One header names the columns, right above the rows: the last one is how long each worker's
    # latest phase took, not the time since the launch started.
    headers = [i for i, s in enumerate(shown) if s.startswith("  WORKER ")]
    assert len(headers) == 1, f"one header line (no stale copies)\n{text}"
    assert shown[headers[0]].split() == [
        "WORKER",
        "PROCESS",
        "LATEST",
        "PHASE",
        "THAT",
        "PHASE",
        "TOOK",
    ]
    assert [s.split()[0] for s in shown[headers[0] + 1 : last_row + 1]] == [
        "http.0",
        "scheduler.0",
        "scheduler.1",
    ], text


def test_with_stdout_redirected_the_table_stays_clean_and_stdout_plain(tmp_path):
    import pyte

    out_path = tmp_path / "stdout.txt"
    with open(out_path, "w") as out:
        stream = _run_on_pty(160, stdout=out)
    screen = pyte.Screen(160, 400)
    pyte.ByteStream(screen).feed(stream)
    shown = [line.rstrip() for line in screen.display]
    written = out_path.read_text()
    assert "\x1b" not in written, written
    for worker in ("http.0", "scheduler.0", "scheduler.1"):
        # odd lines go to stderr (the terminal, above the table), even ones to stdout (the file)
        for i in range(LINES):
            line = f"log line {i} of {worker}"
            if i % 2:
                assert shown.count(line) == 1 and line not in written, (line, "\n".join(shown))
            else:
                assert written.count(line + "\n") == 1 and line not in shown, (line, written)
        rows = [s for s in shown if s.startswith(f"  {worker} ")]
        assert len(rows) == 1, "\n".join(shown)


def test_without_a_terminal_lines_are_plain():
    with Run(
        [*_chatty_args(), "--stop-grace-period", "5"], env={"TESTWORKER_LINES": str(LINES)}
    ) as run:
        run.wait_ready(120)
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0, run
        both = run.stdout + run.stderr
        assert "\x1b" not in both, run
        for worker in ("http.0", "scheduler.0", "scheduler.1"):
            for i in range(LINES):
                assert both.count(f"log line {i} of {worker}\n") == 1, run
        assert re.search(r"sglang-launch: scheduler\.1 \(pid \d+\) ready", run.stderr), run
        run.assert_nothing_left()


# ------------------------------------------------------------------ the embedded Launcher
def _launch_error(**fields) -> dict:
    """``Launcher(**fields).start()``'s ``LaunchError``: its exit code and text."""
    from launcher import Launcher, LaunchError

    with pytest.raises(LaunchError) as caught:
        Launcher(**fields).start(timeout=60)
    return {"code": caught.value.exit_code, "text": str(caught.value)}


@pytest.mark.usefixtures("fresh_process")  # the launcher's own process is this one
def test_embedded_launcher_errors_name_keyword_arguments(monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    data = {
        "missing": _launch_error(model_path="/no/such/model/dir"),
        "encoder": _launch_error(model_path="all-MiniLM-L6-v2", tp_size=2, port=free_port()),
    }
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        data["busy"] = _launch_error(port=holder.getsockname()[1])
    for name in ("missing", "encoder", "busy"):
        assert data[name]["code"] == 2, data
        assert "--" not in data[name]["text"].replace("=" * 72, ""), (
            f"CLI spelling in {name}\n{data}"
        )
    assert "model_path='/no/such/model/dir' does not exist" in data["missing"]["text"], data
    assert "tp_size=2 needs a causal LM" in data["encoder"]["text"], data
    assert "tp_size=1 and scale out with dp_size=2" in data["encoder"]["text"], data
    assert "is already in use" in data["busy"]["text"] and "pass port=N" in data["busy"]["text"], (
        data
    )


def test_a_worker_hung_in_start_up_is_killed_at_the_start_up_timeout_not_after_the_grace():
    """``--startup-timeout 3 --stop-grace-period 600``: the hung worker (it ignores SIGTERM) is
    still starting when the deadline passes, so it is killed at once, as every worker still
    starting is; the grace period would keep the launch for ten minutes."""
    args = [
        "--startup-timeout",
        "3",
        "--stop-grace-period",
        "600",
        "--scheduler-target",
        "support.workers.hang",
        "--http-target",
        READY_WAIT,
    ]
    with Run([*args, "--port", str(free_port())]) as run:
        assert run.wait(120) == 3, run
        err = run.stderr
        assert "start-up did not finish within 3s" in err, run
        assert re.search(r"scheduler\.0 \(pid \d+\) stopped", err), run
        assert "scheduler.0" in err and "exited SIGKILL" in err, run
        run.assert_nothing_left()
