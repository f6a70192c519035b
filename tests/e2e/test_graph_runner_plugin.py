"""A platform plugin (a real dist-info entry point, selected with ``SGLANG_PLATFORM``) whose
``support_cuda_graph()`` is true decodes a real launch through the class its
``get_graph_runner_cls()`` returns: here a subclass of SGLang's ``CudaGraphRunner``, imported by
SGLang's module name (this project's runner through the aliases), which records its start and
each replay in the file named by ``MARK_GRAPH_RUNNER``. The platform's compile backend is
``eager`` (no device graphs on this machine), so the runner's buckets (``--cuda-graph-max-bs 2``:
1 and 2 rows) are traced by dynamo and run as traced. The greedy tokens are transformers'
``generate()``'s."""

from __future__ import annotations

import pytest
from support.plugins import platform_plugin
from support.serving import build_tiny_llama, post, server_env, start_server

from launchspec.model_source import embedding_model_dir

pytestmark = pytest.mark.e2e

GRAPH_PLATFORM = """
def get_default_attention_backend(self):
    return 'torch_native'

def support_cuda_graph(self):
    return True

def get_compile_backend(self, mode=None):
    return 'eager'

def get_graph_runner_cls(self):
    import os
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    def mark(line):
        with open(os.environ['MARK_GRAPH_RUNNER'], 'a') as f:
            f.write(line + '\\n')

    class MarkingRunner(CudaGraphRunner):
        def __init__(self, model_runner):
            super().__init__(model_runner)
            mark('init ' + ','.join(map(str, self.buckets)))

        def replay(self, forward_batch):
            mark(f'replay {forward_batch.decode_rows}')
            return super().replay(forward_batch)

    return MarkingRunner
"""


def test_a_platform_with_graph_support_decodes_a_launch_through_its_runner(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    site = tmp_path / "site"
    site.mkdir()
    platform_plugin(site, "graphs", class_body=GRAPH_PLATFORM, tag="graphs")
    tiny = build_tiny_llama(tmp_path / "tiny-llama", embedding_model_dir())
    marks = tmp_path / "graph-runner.txt"
    env = server_env(
        SGLANG_USE_CPU_ENGINE=None,
        SGLANG_PLATFORM="graphs",
        PYTHONPATH=str(site),
        MARK_GRAPH_RUNNER=str(marks),
    )
    args = ["--model-path", str(tiny), "--max-total-tokens", "512", "--cuda-graph-max-bs", "2"]
    args += ["--dtype", "float32"]  # greedy tokens compared with transformers' float32 generate()
    server = start_server(args, tmp_path, "graphs", env=env)
    try:
        started = marks.read_text().splitlines()
        assert started[0] == "init 1,2", (started, server.log)
        body = {
            "text": "Once upon a time",
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        }
        response = post(f"{server.url}/generate", body)
        assert response.status_code == 200, (response.text, server.log)
        got = [entry[1] for entry in response.json()["meta_info"]["output_token_logprobs"]]
        replays = marks.read_text().splitlines()[len(started) :]
        assert replays == ["replay 1"] * 5, replays  # every decode step after the prefill's
    finally:
        server.stop()
    ids = AutoTokenizer.from_pretrained(tiny)("Once upon a time", return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert got == ref[0, ids.shape[1] :].tolist()
