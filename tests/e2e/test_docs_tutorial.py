"""The plugin tutorial in docs/plugins.md is complete and runnable, as written.

The test takes the code blocks of "Writing a platform plugin" and "A minimal plugin" (each block
starts with a ``# <path>`` line naming its file), writes the two packages into a temporary
folder, installs them with real pip (``--target``, no network) and then, with that folder on
``PYTHONPATH`` and the tutorial's own switch turned on:

- ``sglang-launch check-platform`` (both runtimes) says "conforms" on the tutorial's platform;
- ``sglang-launch`` serves an embeddings request on it (selected automatically, as installed);
- the tutorial's hooks show their effect: the route its ``build_app`` hook adds answers a real
  request, and its ``check_server_args`` hook refuses ``--max-batch-size 65``.

If the page changes, the test installs what the page then says.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from support import clean_env, free_port, pip_install_into
from support.serving import REPO, cli_command, post, server_env, start_server

pytestmark = pytest.mark.e2e  # installs packages and starts the launcher

DOC = REPO / "docs" / "plugins.md"
FENCE = re.compile(r"^```(?:toml|python)\n(.*?)^```", re.S | re.M)
HEADER = re.compile(r"^# (\S+\.(?:py|toml))\b")


def section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def files_of(text: str) -> dict[str, str]:
    """``{path: source}`` for the blocks of ``text`` whose first line names a file."""
    files = {}
    for block in FENCE.findall(text):
        first, _, rest = block.partition("\n")
        match = HEADER.match(first)
        if match:
            files[match.group(1)] = rest
    return files


def tutorial() -> dict[str, dict[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    return {
        "platform": files_of(section(text, "## Writing a platform plugin", "## Writing a plugin")),
        "general": files_of(section(text, "### A minimal plugin", "### Hook types")),
    }


def required_in_doc() -> list[str]:
    """The methods the page lists under "What a launch needs"."""
    text = section(
        DOC.read_text(encoding="utf-8"), "**What a launch needs.**", "The diffusion runtime"
    )
    return re.findall(r"^- `(\w+)\(", text, re.M)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tutorial")
    site = root / "site"
    for name, files in tutorial().items():
        assert "pyproject.toml" in files and any(p.endswith("__init__.py") for p in files), (
            name,
            files,
        )
        source = root / name
        for rel, code in files.items():
            path = source / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code, encoding="utf-8")
        proc = pip_install_into(source, site)
        assert proc.returncode == 0, (
            f"pip could not install the tutorial's {name} package:\n{proc.stderr}"
        )
    init = tutorial()["platform"]["my_platform_plugin/__init__.py"]
    switch = re.search(r'os\.environ\.get\("(\w+)"', init).group(1)  # the page's opt-in variable
    return {"site": site, "switch": {switch: "1"}}


def test_the_page_lists_what_check_platform_requires():
    import conformance.catalog as catalog

    assert sorted(required_in_doc()) == sorted(
        method for method, _ in catalog.required_methods("srt")
    )


def test_check_platform_says_the_tutorial_platform_conforms(installed):
    env = clean_env(PYTHONPATH=f"{installed['site']}:{REPO}", **installed["switch"])
    tables = {}
    for runtime in ("srt", "diffusion"):
        run = subprocess.run(
            [*cli_command(), "check-platform", "--runtime", runtime],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(REPO),
            timeout=300,
        )
        summary = run.stdout.strip().splitlines()[-1]
        assert run.returncode == 0, run.stdout + run.stderr
        assert summary.startswith(f"check-platform {runtime} on plugin:my_device:"), summary
        assert summary.endswith("conforms"), summary
        tables[runtime] = run.stdout
    # The model ran through the serving runtime on the tutorial's platform.
    assert re.search(r"^  pass +workload\.srt_forward +BertModel on cpu", tables["srt"], re.M), (
        tables["srt"]
    )


def test_a_launch_serves_on_the_tutorial_platform_with_the_tutorial_hooks(installed, tmp_path):
    env = server_env(
        SGLANG_USE_CPU_ENGINE=None, PYTHONPATH=str(installed["site"]), **installed["switch"]
    )
    server = start_server([], tmp_path, "tutorial", env=env)
    try:
        assert "platform plugin:my_device" in server.log, server.log
        r = post(server.url + "/v1/embeddings", {"input": "a cat sits on the mat"})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["embedding"]) == 384
        import httpx

        hello = httpx.get(server.url + "/my-plugin/hello", timeout=30)  # the build_app hook's route
        assert hello.status_code == 200, hello.text
        assert hello.json() == {"plugin": "my_general_plugin", "max_batch_size": 32}
    finally:
        server.stop()
    refused = subprocess.run(
        [*cli_command(), "--max-batch-size", "65", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "my_general_plugin supports --max-batch-size up to 64" in refused.stderr
