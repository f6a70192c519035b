"""The decode step's runner (serving.srt.model_executor.decode_runner), in-process on a tiny Llama
built at test time (tests/support/serving.py), on the real CPU platform class and subclasses of
it that answer the contract otherwise:

- ``--enable-torch-compile`` compiles the decode step with the platform's
  ``get_compile_backend()`` (here a registered dynamo backend that counts its compiles and
  calls), once for every batch size up to ``--torch-compile-max-bs``; larger steps and prompt
  steps run eager, and every sequence gets the tokens it gets eagerly;
- compiled with inductor in float32, greedy tokens equal transformers' ``generate()``;
- with inductor the step is saved whole, and a second start loads it instead of tracing;
- a platform whose ``support_cuda_graph()`` is true decodes through the class its
  ``get_graph_runner_cls()`` returns, used as returned, unless ``--disable-cuda-graph``; one
  that cannot give a usable class stops start-up naming it and the way out.
"""

from __future__ import annotations

import pytest
from support.serving import build_tiny_llama

pytestmark = pytest.mark.e2e  # loads a real model through transformers, compiles (seconds)

pytest.importorskip("transformers")

from launchspec.model_source import embedding_model_dir, resolve_model  # noqa: E402
from launchspec.server_args import ServerArgs, ServerArgsError  # noqa: E402
from platforms.builtin.cpu import CpuSRTPlatform  # noqa: E402
from serving.errors import ModelLoadError  # noqa: E402
from serving.srt.model_executor.compiled_step import CompiledDecodeStep  # noqa: E402
from serving.srt.model_executor.decode_runner import (  # noqa: E402
    DecodeOptions,
    choose_decode_runner,
)
from serving.srt.model_runner import ModelRunner  # noqa: E402
from serving.srt.sampling import Sequence  # noqa: E402
from serving.wire import SamplingParams  # noqa: E402

PROMPTS = [
    "hello world",
    "the quick brown fox jumps over",
    "once upon a time",
    "a b c d e f",
    "to be or not to be",
    "in the beginning",
]
COUNTS = {"compiles": 0, "calls": 0}
COUNTING = "sglang_launch_test_counting"


def _counting_backend(gm, example_inputs):
    """A dynamo backend that runs the graph as traced, counting compiles and calls."""
    COUNTS["compiles"] += 1

    def run(*args):
        COUNTS["calls"] += 1
        return gm.forward(*args)

    return run


class CountingPlatform(CpuSRTPlatform):
    def get_compile_backend(self, mode=None):
        return COUNTING


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch._dynamo

    if COUNTING not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name=COUNTING)(_counting_backend)
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


def _runner(path, platform, dtype="auto"):
    runner = ModelRunner(resolve_model(path), platform=platform, max_batch_size=8, dtype=dtype)
    runner.warm_up()
    return runner


@pytest.fixture(scope="module")
def eager(tiny):
    return _runner(tiny, CpuSRTPlatform())


def _int4_runner(path, compiled):
    """A float32 runner of ``path`` with int4 weight-only layers (wide from 3 rows), compiled or
    eager, for batches of up to 4 rows."""
    runner = ModelRunner(
        resolve_model(path),
        platform=CpuSRTPlatform(),
        max_batch_size=8,
        dtype="float32",
        torchao_config="int4wo-32",
        wide_step_tokens=3,
    )
    runner.warm_up()
    options = DecodeOptions(enable_torch_compile=compiled, torch_compile_max_bs=4)
    choose_decode_runner(runner, options)
    return runner


def _tokens(runner, prompts, n=10):
    params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    seqs = [
        Sequence(f"r{i}", runner.encode_prompt(p, n), params, seed=0) for i, p in enumerate(prompts)
    ]
    runner.run_to_end(seqs)
    return [s.output_ids for s in seqs]


def test_the_compiled_step_uses_the_platforms_backend_once_for_every_batch_size(tiny, eager):
    runner = _runner(tiny, CountingPlatform())
    step = choose_decode_runner(
        runner, DecodeOptions(enable_torch_compile=True, torch_compile_max_bs=4)
    )
    assert isinstance(step, CompiledDecodeStep) and runner.graph_runner is step
    assert step.backend == COUNTING and sorted(step.compile_seconds) == [1, 4]
    assert step.origin == "traced" and step.saved_path is None  # only inductor's step is saved
    compiles, calls = COUNTS["compiles"], COUNTS["calls"]
    assert compiles >= 1 and calls >= 2  # the captured sizes ran through the compiled graph
    for size in (1, 2, 3, 4, 6):  # 6 > --torch-compile-max-bs: eager
        prompts = PROMPTS[:size]
        assert _tokens(runner, prompts) == _tokens(eager, prompts), size
    assert COUNTS["compiles"] == compiles  # no recompile for any batch size
    assert COUNTS["calls"] >= calls + 4 * 9  # each decode step of 1..4 rows ran compiled


def test_compiled_float32_greedy_tokens_equal_transformers_generate(tiny):
    import torch

    runner = _runner(tiny, CpuSRTPlatform(), "float32")  # inductor, the CPU platform's backend
    choose_decode_runner(runner, DecodeOptions(enable_torch_compile=True, torch_compile_max_bs=2))
    assert runner.graph_runner.backend == "inductor"
    prompts = PROMPTS[:2]
    got = _tokens(runner, prompts, n=12)
    for prompt, tokens in zip(prompts, got, strict=True):
        ids = torch.tensor([runner.encode_prompt(prompt, 12)])
        with torch.inference_mode():
            ref = runner.model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert ref[0, ids.shape[1] :].tolist() == tokens, prompt


def test_a_second_start_loads_the_saved_step_and_a_broken_file_is_compiled_again(tiny, caplog):
    """With inductor the step is compiled ahead of time and saved under inductor's cache; a
    later start of the same model loads it (no trace) and decodes the same tokens; a file that
    cannot be loaded is named in a warning, compiled again and replaced."""
    import logging
    from pathlib import Path

    def start():
        runner = _runner(tiny, CpuSRTPlatform(), "float32")
        options = DecodeOptions(enable_torch_compile=True, torch_compile_max_bs=2)
        choose_decode_runner(runner, options)
        return runner

    first = start()
    path = Path(first.graph_runner.saved_path)
    assert first.graph_runner.origin in ("saved", "loaded") and path.is_file()
    expected = _tokens(first, PROMPTS[:2])
    second = start()
    assert second.graph_runner.origin == "loaded" and second.graph_runner.saved_path == str(path)
    assert _tokens(second, PROMPTS[:2]) == expected

    path.write_bytes(b"not a saved step")
    with caplog.at_level(logging.WARNING, logger="sglang_launch.compiled_step"):
        third = start()
    assert f"the saved decode step {path} cannot be loaded" in caplog.text
    assert third.graph_runner.origin == "saved" and path.read_bytes() != b"not a saved step"
    assert _tokens(third, PROMPTS[:2]) == expected


def test_another_checkpoint_of_the_same_shapes_loads_the_saved_step_with_its_own_weights(
    tiny, tmp_path
):
    """A saved step holds no weights (they are its inputs): a checkpoint of the architecture and
    shapes of one saved before, here in the same process, loads its file and decodes with its
    own weights, every packed and quantized layer included (int4, their merged siblings)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    other = tmp_path / "other"
    model = AutoModelForCausalLM.from_pretrained(tiny)
    torch.manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(other)

    sizes = (1, 4)  # the int4 kernel; the wide steps' merged product
    first = _int4_runner(tiny, True)
    first_tokens = {size: _tokens(first, PROMPTS[:size]) for size in sizes}
    second = _int4_runner(other, True)  # what a restart (or a reload) of the other checkpoint does
    assert second.graph_runner.origin == "loaded"
    assert second.graph_runner.saved_path == first.graph_runner.saved_path
    for size in sizes:
        want = _tokens(_int4_runner(other, False), PROMPTS[:size])
        assert _tokens(second, PROMPTS[:size]) == want, size
        assert first_tokens[size] != want, size  # the checkpoints do differ


def test_a_compiled_step_over_int4_weights_gives_the_eager_tokens(tiny):
    """The compiled step over weight-only int4 layers (``--torchao-config int4wo-32``): their
    kernel computes only a step's own rows (one row runs padded to two), wider steps go through
    the dense copy (``--wide-step-tokens``); float32 greedy tokens are the eager ones."""

    eager_int4, compiled_int4 = _int4_runner(tiny, False), _int4_runner(tiny, True)
    assert isinstance(compiled_int4.graph_runner, CompiledDecodeStep)
    for size in (1, 2, 4):  # the kernel alone, padded; the kernel; the dense copy
        prompts = PROMPTS[:size]
        assert _tokens(compiled_int4, prompts) == _tokens(eager_int4, prompts), size


class Recording:
    """A vendor's graph runner: its own class, not this project's, recording its replays and
    computing the logits eagerly."""

    instances: list[Recording] = []

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.replays: list[int] = []
        Recording.instances.append(self)

    def can_run(self, forward_batch):
        return forward_batch.decode_rows > 0 and not forward_batch.extend_seq_lens

    def replay(self, forward_batch):
        import torch

        self.replays.append(forward_batch.decode_rows)
        out = self.model_runner.model(
            input_ids=forward_batch.input_ids[None, :],
            position_ids=forward_batch.positions[None, :],
            attention_mask=torch.ones((1, 1, 1, 1), dtype=torch.bool),
            use_cache=False,
            forward_batch=forward_batch,
        )
        return out.logits[0][:, None, :]


def _graph_platform(returns):
    class GraphPlatform(CpuSRTPlatform):
        def support_cuda_graph(self):
            return True

        def get_graph_runner_cls(self):
            if returns is NotImplemented:
                raise NotImplementedError("get_graph_runner_cls")
            return returns

    return GraphPlatform()


def test_a_platform_with_graph_support_decodes_through_its_runner_class_as_returned(
    tiny, eager, monkeypatch
):
    monkeypatch.setattr(eager, "platform", _graph_platform(Recording))
    try:
        runner = choose_decode_runner(eager, DecodeOptions())
        assert type(runner) is Recording and eager.graph_runner is runner
        assert runner.model_runner is eager
        got = _tokens(eager, PROMPTS[:3])
        assert runner.replays and max(runner.replays) == 3, runner.replays
    finally:
        eager.graph_runner = None
    assert got == _tokens(eager, PROMPTS[:3])
    # --disable-cuda-graph: the platform's runner is not made; decode runs eager.
    Recording.instances.clear()
    assert choose_decode_runner(eager, DecodeOptions(disable_cuda_graph=True)) is None
    assert eager.graph_runner is None and not Recording.instances


class NoReplay:
    def __init__(self, model_runner):
        pass

    def can_run(self, forward_batch):
        return True


class Broken(Recording):
    def __init__(self, model_runner):
        raise RuntimeError("no device graphs here")


@pytest.mark.parametrize(
    ("returns", "needles"),
    [
        (NotImplemented, ["does not implement get_graph_runner_cls()"]),
        ("CudaGraphRunner", ["returned 'CudaGraphRunner', not a class"]),
        (NoReplay, ["NoReplay has no replay()", "can_run(forward_batch) and replay"]),
        (Broken, ["Broken failed to start: RuntimeError: no device graphs here"]),
    ],
)
def test_a_graph_runner_a_launch_cannot_use_stops_start_up_naming_it(
    eager, monkeypatch, returns, needles
):
    monkeypatch.setattr(eager, "platform", _graph_platform(returns))
    with pytest.raises(ModelLoadError) as caught:
        choose_decode_runner(eager, DecodeOptions())
    message = str(caught.value)
    for needle in [*needles, "--disable-cuda-graph"]:
        assert needle in message, message
    assert eager.graph_runner is None


def test_batch_size_flags_below_one_are_refused_naming_them():
    for field, flag in (
        ("torch_compile_max_bs", "--torch-compile-max-bs"),
        ("cuda_graph_max_bs", "--cuda-graph-max-bs"),
    ):
        with pytest.raises(ServerArgsError) as caught:
            ServerArgs(**{field: 0}).check_server_args()
        assert f"{flag} 0 must be at least 1" in str(caught.value)
