"""The running generation batch in-process on a tiny Llama built at test time (random weights,
BERT's real tokenizer), on the real CPU platform class: sequences that join a running batch or
share it get the tokens they get alone (greedy and seeded sampling), a short sequence that joins
a long one finishes first, a cancelled sequence leaves at once and the others go on, a prompt
longer than a prefill chunk is prefilled over several steps while running sequences keep
decoding, penalties and logprobs follow OpenAI's meaning, a model with a sliding attention
window batches the same way; the radix prefix cache, a paged pool and a registered attention
backend give the same tokens, and a model whose attention the pool cannot compute is refused."""

from __future__ import annotations

import math

import pytest
from support.serving import build_tiny_llama

pytestmark = pytest.mark.e2e  # loads a real model through transformers (seconds)

pytest.importorskip("transformers")

from launchspec.model_source import embedding_model_dir, resolve_model  # noqa: E402
from platforms.builtin.cpu import CpuSRTPlatform  # noqa: E402
from serving.srt.model_runner import ModelRunner  # noqa: E402
from serving.srt.sampling import Sequence  # noqa: E402
from serving.wire import SamplingParams  # noqa: E402

GREEDY = dict(temperature=0.0, ignore_eos=True)
HOT = dict(temperature=1.3, top_p=0.95, top_k=200, ignore_eos=True)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())
    runner = ModelRunner(
        resolve_model(path), platform=CpuSRTPlatform(), chunked_prefill_size=-1, dtype="float32"
    )
    runner.warm_up()
    return runner


def seq(runner, rid, text, seed=0, stream=False, **params):
    p = SamplingParams(**params)
    return Sequence(rid, runner.encode_prompt(text, p.max_new_tokens), p, seed, stream)


def alone(runner, rid, text, seed=0, **params):
    s = seq(runner, rid, text, seed, **params)
    runner.run_to_end([s])
    return s.output_ids


def run_to_end(batch, log=None):
    """Step ``batch`` until it is empty; ``log`` gets each step's rids that got a token."""
    for _ in range(10_000):
        if not len(batch):
            return
        touched = batch.step()
        if log is not None:
            log.append([s.rid for s in touched])
    raise AssertionError("the batch never emptied")


def test_a_sequence_gets_its_tokens_alone_whatever_joins_or_shares_its_batch(runner):
    batch = runner.new_batch()
    long = seq(runner, "long", "once upon a time", max_new_tokens=40, **GREEDY)
    batch.join([long])
    for _ in range(7):
        batch.step()
    # Joining mid-way, at different lengths, with a sampled one and a penalised one beside them.
    greedy = seq(runner, "greedy", "the quick brown fox jumps over", max_new_tokens=20, **GREEDY)
    sampled = seq(runner, "sampled", "hello world", seed=11, max_new_tokens=25, **HOT)
    penal = seq(runner, "penal", "a b c", max_new_tokens=15, frequency_penalty=1.5, **GREEDY)
    batch.join([greedy, sampled])
    batch.step()
    batch.join([penal])
    run_to_end(batch)
    assert long.output_ids == alone(runner, "x", "once upon a time", max_new_tokens=40, **GREEDY)
    assert greedy.output_ids == alone(
        runner, "x", "the quick brown fox jumps over", max_new_tokens=20, **GREEDY
    )
    assert sampled.output_ids == alone(
        runner, "x", "hello world", seed=11, max_new_tokens=25, **HOT
    )
    assert penal.output_ids == alone(
        runner, "x", "a b c", max_new_tokens=15, frequency_penalty=1.5, **GREEDY
    )
    # The seed is what decides: another seed samples other tokens.
    assert sampled.output_ids != alone(
        runner, "x", "hello world", seed=12, max_new_tokens=25, **HOT
    )


def test_a_short_sequence_that_joins_a_long_one_finishes_first(runner):
    batch = runner.new_batch()
    long = seq(runner, "long", "once upon a time", max_new_tokens=200, **GREEDY)
    batch.join([long])
    batch.step()
    short = seq(runner, "short", "hello", max_new_tokens=2, **GREEDY)
    batch.join([short])
    finished = []
    for _ in range(400):
        for s in batch.step():
            if s.finished:
                finished.append(s.rid)
        if not len(batch):
            break
    assert finished == ["short", "long"]
    assert len(long.output_ids) == 200 and len(short.output_ids) == 2


def test_a_cancelled_sequence_leaves_at_once_and_the_others_go_on_unchanged(runner):
    batch = runner.new_batch()
    keep = seq(runner, "keep", "the quick brown fox", max_new_tokens=30, **GREEDY)
    drop = seq(
        runner, "drop", "a much longer prompt than the other one", max_new_tokens=30, **GREEDY
    )
    batch.join([keep, drop])
    for _ in range(5):
        batch.step()
    stopped = batch.cancel(["drop"])
    assert stopped == [drop] and drop.finish_reason == "abort"
    assert len(drop.output_ids) < 30 and [s.rid for s in batch.sequences()] == ["keep"]
    run_to_end(batch)
    assert keep.output_ids == alone(runner, "x", "the quick brown fox", max_new_tokens=30, **GREEDY)
    # Cancelling one still waiting for its prefill works too.
    waiting = seq(runner, "waiting", "hello", max_new_tokens=5, **GREEDY)
    batch.join([waiting])
    assert batch.cancel(["waiting"]) == [waiting] and not len(batch)


def test_a_long_prompt_prefills_in_chunks_while_running_sequences_keep_decoding(runner):
    long_prompt = " ".join(["word"] * 60)
    batch = runner.new_batch()
    batch.chunk_tokens = 16  # this batch's prefill chunk: the long prompt takes several steps
    running = seq(runner, "running", "hello world", stream=True, max_new_tokens=40, **GREEDY)
    batch.join([running])
    batch.step()
    late = seq(runner, "late", long_prompt, max_new_tokens=5, **GREEDY)
    assert len(late.prompt_ids) > 3 * 16
    batch.join([late])
    log: list[list[str]] = []
    run_to_end(batch, log)
    before_first_token = log[: next(i for i, rids in enumerate(log) if "late" in rids)]
    # The long prompt took several steps to prefill, and the running stream got a token in each.
    assert len(before_first_token) >= 3
    assert all(rids == ["running"] for rids in before_first_token)
    assert late.output_ids == alone(runner, "x", long_prompt, max_new_tokens=5, **GREEDY)
    assert running.output_ids == alone(runner, "x", "hello world", max_new_tokens=40, **GREEDY)


def test_logprobs_are_of_the_penalised_distribution_before_temperature(runner):
    import torch

    prompt = "hello world"
    hot = seq(
        runner,
        "hot",
        prompt,
        seed=3,
        max_new_tokens=6,
        temperature=2.0,
        ignore_eos=True,
        logprobs=True,
        top_logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    runner.run_to_end([hot])
    assert len(hot.logprobs) == 6
    # Recompute each step's distribution from the model: logits less the penalties of the
    # tokens generated before it, no temperature.
    ids = list(hot.prompt_ids)
    for step, entry in enumerate(hot.logprobs):
        with torch.no_grad():
            logits = runner.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        for token in set(hot.output_ids[:step]):
            count = hot.output_ids[:step].count(token)
            logits[token] -= 0.5 + 0.25 * count
        logp = torch.log_softmax(logits, dim=-1)
        token = hot.output_ids[step]
        assert entry.token_id == token and entry.token == runner.token_text(token)
        assert math.isclose(entry.logprob, float(logp[token]), abs_tol=1e-4)
        best = torch.topk(logp, 3)
        assert [t for t, _ in entry.top] == [runner.token_text(i) for i in best.indices.tolist()]
        assert all(
            math.isclose(v, float(w), abs_tol=1e-4)
            for (_, v), w in zip(entry.top, best.values, strict=True)
        )
        ids.append(token)
    # Greedy with logprobs: the chosen token is the most likely one.
    plain = seq(runner, "g", prompt, max_new_tokens=4, logprobs=True, top_logprobs=1, **GREEDY)
    runner.run_to_end([plain])
    assert all(e.top[0][0] == e.token and e.top[0][1] == e.logprob for e in plain.logprobs)
    assert seq(runner, "n", prompt, max_new_tokens=2, **GREEDY).take_logprobs() is None


def test_penalties_discourage_tokens_already_generated(runner):
    free = alone(runner, "free", "a a a a", max_new_tokens=30, **GREEDY)
    presence = alone(runner, "p", "a a a a", max_new_tokens=30, presence_penalty=5.0, **GREEDY)
    frequency = alone(runner, "f", "a a a a", max_new_tokens=30, frequency_penalty=5.0, **GREEDY)
    assert len(set(free)) < len(set(presence))
    assert len(set(presence)) == len(presence)  # a large presence penalty: no token twice
    assert len(set(free)) < len(set(frequency))


def test_a_sliding_window_model_batches_continuously_with_transformers_tokens(tmp_path):
    """A tiny Mistral whose attention window (8) is shorter than its sequences: joins at other
    lengths and a chunked prefill give what transformers' own ``generate`` gives alone."""
    import torch
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    path = tmp_path / "tiny-mistral"
    tok = AutoTokenizer.from_pretrained(embedding_model_dir())
    tok.save_pretrained(path)
    config = MistralConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=8,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(path)
    runner = ModelRunner(resolve_model(path), platform=CpuSRTPlatform(), dtype="float32")
    runner.warm_up()
    assert runner.attention_backend == "torch_native"  # its sliding layers run over the pool

    def reference(text: str, n: int) -> list[int]:
        ids = torch.tensor([runner.encode_prompt(text, n)])
        with torch.inference_mode():
            out = runner.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out[0, ids.shape[1] :].tolist()

    asked = [("hello world", 20), ("the quick brown fox jumps over the lazy dog", 15)]
    asked.append((" ".join(["word"] * 30), 10))  # longer than a chunk of 4
    batch = runner.new_batch()
    batch.chunk_tokens = 4
    seqs = [
        seq(runner, f"s{i}", text, max_new_tokens=n, **GREEDY) for i, (text, n) in enumerate(asked)
    ]
    batch.join(seqs[:1])
    for _ in range(3):
        runner.generate(batch)
    batch.join(seqs[1:])
    run_to_end(batch)
    assert [s.output_ids for s in seqs] == [reference(text, n) for text, n in asked]


def tiny_runner(tmp_path, name: str, **options) -> ModelRunner:
    path = build_tiny_llama(tmp_path / name, embedding_model_dir())
    options.setdefault("dtype", "float32")  # compared with transformers' float32 generate()
    r = ModelRunner(resolve_model(path), platform=CpuSRTPlatform(), **options)
    r.warm_up()
    return r


def mixed_workload(runner, seed: int) -> dict[str, list[int]]:
    """Sequences with shared and unshared prompt prefixes joining at random steps, some
    cancelled part way, on ``runner``; the tokens of each one that was not cancelled."""
    import random

    rnd = random.Random(seed)
    stems = [" ".join(["alpha"] * 40), " ".join(["beta gamma"] * 25), "once upon a time"]
    plan = []
    for i in range(24):
        text = (
            f"{rnd.choice(stems)} {' '.join(rnd.choice('xyzw') for _ in range(rnd.randint(1, 6)))}"
        )
        if rnd.random() < 0.25:
            text = f"unshared {i} {text}"
        plan.append((f"r{i}", text, rnd.randint(3, 30), rnd.random() < 0.2, rnd.randint(0, 40)))
    batch = runner.new_batch()
    batch.chunk_tokens = 32
    seqs, cancel_at = {}, {}
    step = 0
    pending = sorted(plan, key=lambda p: p[4])
    while pending or len(batch):
        while pending and pending[0][4] <= step:
            rid, text, n, cancel, _ = pending.pop(0)
            seqs[rid] = seq(runner, rid, text, max_new_tokens=n, **GREEDY)
            batch.join([seqs[rid]])
            if cancel:
                cancel_at[rid] = step + rnd.randint(1, 6)
        batch.cancel([rid for rid, at in cancel_at.items() if at == step])
        batch.step()
        step += 1
        assert step < 5000
    return {rid: s.output_ids for rid, s in seqs.items() if rid not in cancel_at}


def test_the_prefix_cache_gives_the_same_greedy_tokens_as_no_cache_under_eviction(tmp_path):
    """A random mixed workload (shared and unshared prefixes, cancellations, joins at any step)
    on a pool small enough that the cache must evict: the same greedy tokens with the radix
    cache on as off, prefixes were reused, and every slot is back when the batch is empty."""
    options = dict(max_total_tokens=400, chunked_prefill_size=32)
    cached = tiny_runner(tmp_path, "on", **options)
    plain = tiny_runner(tmp_path, "off", disable_radix_cache=True, **options)
    for seed in (1, 2):
        want = mixed_workload(plain, seed)
        assert mixed_workload(cached, seed) == want
    memory = cached.memory
    assert memory.cached_tokens_total > 0 and memory.tree.evictable_size() > 0
    assert memory.allocator.available_size() + memory.tree.evictable_size() == memory.size
    assert memory.outstanding == 0 and memory.tree.protected_size() == 0
    assert plain.memory.allocator.available_size() == plain.memory.size


def test_a_repeated_prompt_reuses_its_cached_prefix_with_the_same_tokens(runner):
    """The second of two requests sharing a long prompt prefix prefills only what follows it,
    and gets the tokens the first run of its whole prompt gave with nothing cached."""
    stem = " ".join(["lighthouse keeper"] * 50)
    first = seq(runner, "first", f"{stem} one", max_new_tokens=12, **GREEDY)
    runner.run_to_end([first])
    second = seq(runner, "second", f"{stem} two", max_new_tokens=12, **GREEDY)
    runner.run_to_end([second])
    assert second.cached_tokens >= 100
    batch = runner.new_batch()
    assert batch.flush()
    cold = seq(runner, "cold", f"{stem} two", max_new_tokens=12, **GREEDY)
    runner.run_to_end([cold])
    assert cold.cached_tokens == 0 and cold.output_ids == second.output_ids


def test_a_paged_pool_gives_the_same_tokens(tmp_path, runner):
    paged = tiny_runner(tmp_path, "paged", page_size=4, chunked_prefill_size=8)
    asked = [("hello world", 9), ("the quick brown fox jumps", 14), ("hello world again", 7)]
    seqs = [seq(paged, f"p{i}", t, max_new_tokens=n, **GREEDY) for i, (t, n) in enumerate(asked)]
    batch = paged.new_batch()
    batch.join(seqs[:2])
    batch.step()
    batch.join(seqs[2:])
    run_to_end(batch)
    for s, (text, n) in zip(seqs, asked, strict=True):
        assert s.output_ids == alone(runner, "x", text, max_new_tokens=n, **GREEDY)
    memory = paged.memory
    assert memory.allocator.available_size() + memory.tree.evictable_size() == memory.size


def test_a_registered_attention_backend_is_used_by_name(tmp_path, runner):
    from serving.srt.layers.attention import register_attention_backend
    from serving.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    calls = []

    class Counting(TorchNativeAttnBackend):
        def forward(self, q, k, v, layer, forward_batch):
            calls.append(layer.layer_id)
            return super().forward(q, k, v, layer, forward_batch)

    register_attention_backend("counting", Counting)
    counted = tiny_runner(tmp_path, "counted", attention_backend="counting")
    assert counted.attention_backend == "counting"
    calls.clear()
    out = alone(counted, "x", "hello world", max_new_tokens=5, **GREEDY)
    assert out == alone(runner, "x", "hello world", max_new_tokens=5, **GREEDY)
    assert sorted(set(calls)) == [0, 1] and len(calls) == 2 * 5


def test_an_unknown_attention_backend_is_refused_with_the_registered_names(tmp_path):
    from serving.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="torch_native"):
        tiny_runner(tmp_path, "unknown", attention_backend="no-such-backend")


def test_a_model_whose_attention_the_pool_cannot_compute_is_refused_naming_it(tmp_path):
    """Gemma 2 caps its attention logits (softcap): refused at start-up, naming the class."""
    import torch
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

    from serving.errors import ModelLoadError

    path = tmp_path / "tiny-gemma2"
    tok = AutoTokenizer.from_pretrained(embedding_model_dir())
    tok.save_pretrained(path)
    config = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Gemma2ForCausalLM(config).save_pretrained(path)
    with pytest.raises(ModelLoadError, match="Gemma2Attention caps attention logits"):
        ModelRunner(resolve_model(path), platform=CpuSRTPlatform()).warm_up()


def test_a_long_greedy_run_in_a_held_batch_is_what_transformers_generate_gives(runner):
    """300 tokens: past the room the decode step's growing mask starts with, decoded in one
    entry of the inference mode as the scheduler's loop runs it (``held``), the same tokens as
    transformers' own ``generate()``, and the text of them."""
    import torch

    s = seq(runner, "long", "once upon a time", stream=True, max_new_tokens=300, **GREEDY)
    batch = runner.new_batch()
    with batch.held():
        batch.join([s])
        run_to_end(batch)
    ids = torch.tensor([s.prompt_ids])
    with torch.inference_mode():
        out = runner.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=300,
            min_new_tokens=300,
            do_sample=False,
        )
    assert s.output_ids == out[0, len(s.prompt_ids) :].tolist()
    assert s.text == runner.tokenizer.decode(s.output_ids, skip_special_tokens=True)


def test_the_documented_attention_backend_example_registers_and_serves(tmp_path, runner):
    """docs/plugins.md "Attention backends", its code as written: after ``register()`` the
    backend serves by its name, with the built-in backend's tokens."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    section = doc[doc.index("### Attention backends") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n", 12)]
    namespace: dict = {}
    exec(compile(code, "docs/plugins.md", "exec"), namespace)
    namespace["register"]()
    mine = tiny_runner(tmp_path, "mine", attention_backend="my_backend")
    assert type(mine.attn_backend).__name__ == "MyBackend"
    out = alone(mine, "x", "hello world", max_new_tokens=6, **GREEDY)
    assert out == alone(runner, "x", "hello world", max_new_tokens=6, **GREEDY)


MERGED = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


def test_a_bfloat16_model_on_the_cpu_computes_with_prepacked_weights_and_the_same_tokens(tmp_path):
    """Its linear layers use oneDNN's prepacked weights (``layers.linear``), each alone or with
    the siblings that read its input (``layers.merged_linear``: q/k/v, gate/up), and its greedy
    tokens are those of transformers' own bfloat16 model of the same directory."""
    import torch
    from transformers import AutoModelForCausalLM

    packed = tiny_runner(tmp_path, "bf16", dtype="bfloat16")
    linears = {n: m for n, m in packed.model.named_modules() if type(m) is torch.nn.Linear}
    merged = {n for n, m in linears.items() if "_merged" in m.__dict__}
    assert merged and all(n.rsplit(".", 1)[1] in MERGED for n in merged), merged
    assert all(hasattr(m, "_packed_weight") for n, m in linears.items() if n not in merged)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16).eval()
    for text in ("hello world", "the quick brown fox jumps over the lazy dog"):
        ids = torch.tensor([packed.encode_prompt(text, 16)])
        with torch.inference_mode():
            out = plain.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        want = out[0, ids.shape[1] :].tolist()
        assert alone(packed, "x", text, max_new_tokens=16, **GREEDY) == want
