"""Weight schemes and the dtype through the launcher (issue 40, points 3-4): a scheme the
runtime or the selected platform (a real plugin, found through its entry point) refuses is
exit 2 before any worker starts, naming what is supported; ``--torchao-config int4wo-32``
serves and ``/get_model_info`` says what the weights are; a platform plugin that reports no
bfloat16 and substitutes int8wo for int4wo gets float32 and int8wo, and ``/get_server_info``
says why."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from support import REPO, clean_env, free_port, make_dist
from support.serving import build_tiny_llama, post, server_env, start_server

pytestmark = pytest.mark.e2e

LAUNCH = [sys.executable, "-m", "launcher"]
GREEDY = {"text": "hello world", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}

# A CPU platform plugin (out of tree): no bfloat16 reported, int4 weight-only refused or swapped.
PLATFORM = """
from platforms import PlatformEnum
from platforms.builtin.cpu import CpuSRTPlatform


class {name}(CpuSRTPlatform):
    _enum = PlatformEnum.OOT
    device_name = "cpu"
    supported_quantization = {supported!r}

    def _bf16_feature(self):
        return None

    def get_quantization_config(self, quantization):
        if quantization.startswith("int4"):
            {int4}
        return None


def activate():
    return "{package}.{name}"
"""


def plugin(site, name: str, *, supported: list[str], int4: str) -> dict[str, str]:
    """A platform plugin distribution in ``site``; the environment that selects it."""
    package = f"weights_{name}"
    make_dist(
        site,
        f"weights-{name}",
        entry_points={"sglang.srt.platforms": {name: f"{package}:activate"}},
        modules={
            f"{package}/__init__.py": PLATFORM.format(
                name=name.title(), supported=supported, int4=int4, package=package
            )
        },
    )
    return {
        "SGLANG_PLATFORM": name,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
    }


def launch(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    environ = clean_env(**{"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env})
    return subprocess.run(
        LAUNCH + ["--port", str(free_port()), *argv],
        capture_output=True,
        text=True,
        env=environ,
        cwd=str(REPO),
        timeout=120,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


def test_a_scheme_refused_by_the_runtime_or_the_platform_is_exit_2_naming_it(tiny, site):
    model = ["--model-path", str(tiny)]
    cpu = {"SGLANG_USE_CPU_ENGINE": "1"}
    for argv, env, words in (
        (
            ["--quantization", "fp8"],
            cpu,
            ["--quantization 'fp8' is not implemented by this runtime", "--torchao-config int8wo"],
        ),
        (["--quantization", "gguf"], cpu, ["--model-path is not a .gguf file"]),
        (
            ["--torchao-config", "int4wo-32"],
            plugin(
                site,
                "refuser",
                supported=["int8wo", "int4wo"],
                int4="raise ValueError('no int4 kernels')",
            ),
            ["refuses quantization 'int4wo-32': no int4 kernels", "--torchao-config int8wo"],
        ),
        (
            ["--torchao-config", "int4wo-32"],
            plugin(site, "narrow", supported=["int8wo"], int4="return None"),
            ["does not support quantization 'int4wo-32' (its supported_quantization: int8wo)"],
        ),
    ):
        run = launch(model + argv, **env)
        assert run.returncode == 2, run.stderr
        for word in words:
            assert word in run.stderr, run.stderr
        assert "Traceback" not in run.stderr and "starting" not in run.stderr, run.stderr


def test_the_documented_refusal_is_what_the_command_prints():
    """docs/weights.md's command and its output, as written (the port aside)."""
    import re
    import shlex

    text = (REPO / "docs" / "weights.md").read_text()
    command, output = re.search(
        r"On the CPU platform:\n\n```bash\n(.+?)\n```\n\n```text\n(.+?)\n```", text, re.S
    ).groups()
    argv = shlex.split(command)
    assert argv[0] == "sglang-launch"
    run = launch(argv[1:], SGLANG_USE_CPU_ENGINE="1")
    assert run.returncode == 2, run.stderr
    for line in output.splitlines():
        assert line in run.stderr.splitlines(), (line, run.stderr)


def test_int4wo_serves_and_the_model_info_says_what_the_weights_are(tiny, tmp_path):
    from platforms.builtin.cpu import CpuSRTPlatform

    srv = start_server(
        ["--model-path", str(tiny), "--torchao-config", "int4wo-32"], tmp_path, "int4"
    )
    try:
        answer = post(srv.url + "/generate", GREEDY)
        assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 5
        weights = httpx.get(srv.url + "/get_model_info", timeout=30).json()["weights"]
        auto = CpuSRTPlatform().get_default_dtype()
        assert weights["quantization"] == "int4wo-32" and weights["dtype"] == auto.dtype, weights
        assert weights["dtype_reason"] == f"auto: {auto.reason}", weights
        assert weights["precision"].startswith("14 linears as int4 weight-only (group 32)")
        model = httpx.get(srv.url + "/get_server_info", timeout=30).json()["model"]
        assert (model["dtype"], model["quantization"]) == (auto.dtype, "int4wo-32"), model
    finally:
        srv.stop()


def test_a_platform_without_bf16_gets_float32_and_its_substitute_scheme(tiny, tmp_path, site):
    env = plugin(site, "swapper", supported=[], int4="return 'int8wo'")
    srv = start_server(
        ["--model-path", str(tiny), "--torchao-config", "int4wo-64"],
        tmp_path,
        "swapper",
        env=server_env(SGLANG_USE_CPU_ENGINE=None, **env),
    )
    try:
        assert post(srv.url + "/generate", GREEDY).status_code == 200
        model = httpx.get(srv.url + "/get_server_info", timeout=30).json()["model"]
        assert model["dtype"] == "float32", model
        assert model["dtype_reason"] == (
            "auto: the CPU reports no bfloat16 instructions (AVX512-BF16, AMX-BF16)"
        )
        weights = httpx.get(srv.url + "/get_model_info", timeout=30).json()["weights"]
        assert weights["quantization"] == "int8wo", weights
        assert "int8 weight-only" in weights["precision"], weights
        assert "Swapper substituted it for int4wo-64" in weights["precision"], weights
    finally:
        srv.stop()
