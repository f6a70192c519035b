"""The ``curl`` lines of README.md and docs/api.md work as written: each is run with bash against
a live server (only ``http://127.0.0.1:30000`` is replaced by the test server's address), the
embedding ones against the embedded embedding model, the others against a tiny causal LM given a
chat template, and each must succeed: a JSON answer without an ``error``, a stream of ``data:``
events ending in ``[DONE]``, or the lines it greps for. If a page changes, the test runs what it
then says. (tests/e2e/test_chat_model.py runs the README's first chat against the real model.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from support.serving import REPO, build_tiny_llama, give_chat_template, start_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
]

DOCUMENTED = "http://127.0.0.1:30000"
PAGES = [REPO / "README.md", REPO / "docs" / "api.md"]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def curl_lines(page) -> list[str]:
    """The ``curl`` commands of ``page``'s bash blocks, continuation lines joined."""
    commands = []
    for block in FENCE.findall(page.read_text(encoding="utf-8")):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.strip() for line in joined.splitlines() if line.startswith("curl ")]
    return commands


COMMANDS = [(page.relative_to(REPO).as_posix(), c) for page in PAGES for c in curl_lines(page)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    tmp = tmp_path_factory.mktemp("docs")
    model = give_chat_template(build_tiny_llama(tmp / "my-llama", embedding_model_dir()))
    started = []
    try:
        started.append(start_server([], tmp, "embed"))
        started.append(start_server(["--model-path", str(model)], tmp, "llama"))
        yield {"embeddings": started[0], "generation": started[1]}
    finally:
        for srv in started:
            srv.stop()


def test_the_pages_have_curl_lines_for_the_routes():
    routes = {re.search(r"30000(/[\w/]+)", c)[1] for _, c in COMMANDS}
    assert {
        "/v1/embeddings",
        "/v1/completions",
        "/v1/chat/completions",
        "/generate",
        "/health_generate",
        "/ping",
        "/get_model_info",
        "/metrics",
    } <= routes, routes


@pytest.mark.parametrize(
    "page,command", COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)]
)
def test_each_curl_line_works_as_written(servers, page, command):
    assert DOCUMENTED in command, command
    kind = "embeddings" if "/v1/embeddings" in command else "generation"
    line = command.replace(DOCUMENTED, servers[kind].url)
    run = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=180, cwd=str(REPO)
    )
    assert run.returncode == 0, (command, run.stderr)
    out = run.stdout
    if "| grep" in command:
        assert out.strip(), f"{command}: nothing matched"
    elif '"stream": true' in command:
        data = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
        assert data and data[-1] == "[DONE]", out
        assert all("error" not in json.loads(d) for d in data[:-1]), out
    else:
        answer = json.loads(out)
        assert "error" not in answer, (command, answer)
