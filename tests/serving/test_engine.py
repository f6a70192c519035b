"""The running generation batch in-process on a tiny Llama built at test time (random weights,
BERT's real tokenizer), on the real CPU platform class: sequences that join a running batch or
share it get the tokens they get alone (greedy and seeded sampling), a short sequence that joins
a long one finishes first, a cancelled sequence leaves at once and the others go on, a prompt
longer than a prefill chunk is prefilled over several steps while running sequences keep
decoding, penalties and logprobs follow OpenAI's meaning, and a model with a sliding attention
window batches the same way."""

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
    runner = ModelRunner(resolve_model(path), platform=CpuSRTPlatform(), chunked_prefill_size=-1)
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
    runner = ModelRunner(resolve_model(path), platform=CpuSRTPlatform())
    runner.warm_up()
    assert runner.continuous

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


def test_a_batch_that_does_not_join_gives_the_same_tokens_and_ends_together(runner):
    """The mode for a model whose cache cannot be joined: sequences of different lengths, one
    cancelled, prefilled together and decoded together until the last one ends; each gets the
    tokens it gets alone, and the cancelled one stops at once."""
    asked = [("hello world", 12, GREEDY), ("the quick brown fox", 4, GREEDY), ("seeded", 9, HOT)]
    want = [
        alone(runner, f"a{i}", text, seed=3, max_new_tokens=n, **p)
        for i, (text, n, p) in enumerate(asked)
    ]
    runner.continuous = False
    try:
        batch = runner.new_batch()
    finally:
        runner.continuous = True
    assert not batch.joins and batch.chunk_tokens is None
    seqs = [
        seq(runner, f"s{i}", text, seed=3, max_new_tokens=n, **p)
        for i, (text, n, p) in enumerate(asked)
    ]
    extra = seq(runner, "gone", "to be cancelled", max_new_tokens=50, **GREEDY)
    batch.join([*seqs, extra])
    batch.step()
    assert len(batch) == 4  # one prefill of all four, and a decode of every row
    assert [s.rid for s in batch.cancel(["gone"])] == ["gone"]
    assert extra.finish_reason == "abort" and len(extra.output_ids) == 2
    steps = 1
    while len(batch):
        touched = batch.step()
        steps += 1
        assert "gone" not in {s.rid for s in touched}
        assert len(batch) in (0, 4)  # rows leave together, once the last one has finished
    assert [s.output_ids for s in seqs] == want
    assert steps == 12 - 1  # the first step gave two tokens (prefill, then a decode)


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
