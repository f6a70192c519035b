"""Small GGUF files written at test time with the ``gguf`` package's writer (no tests here).

``build_tiny_gguf`` writes a tiny Llama (random weights, the shape of ``support.serving``'s
``build_tiny_llama``) as llama.cpp lays one out: llama.cpp's tensor names, the query and key
rows in ggml's rotary order, a byte-level BPE tokenizer trained here on a few sentences, a chat
template; its weights stored as F32 or quantised to Q8_0 by the ``gguf`` package. The same model
is also saved as a Hugging Face directory, so that a test can compare what the conversion made
of the file with what went into it. ``write_gguf`` writes any header with a few tensors, for the
files a server must refuse.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<pad>"]
CORPUS = [
    "a cat sits on the mat",
    "the weather is lovely today",
    "stock prices fell sharply",
    "a kitten rests on a rug",
    "how do I reset my password",
    "the quick brown fox jumps over the lazy dog",
    "what is the capital of France? Paris is.",
    "once upon a time there was a small model",
]


def train_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (GPT-2's kind, ``tokenizer.ggml.model = gpt2``) trained on
    ``CORPUS``: every byte is in its vocabulary, so any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def _rotary_rows(weight, heads: int):
    """``weight``'s rows in ggml's rotary order (each head's two halves interleaved), as
    llama.cpp's converter writes a Llama's query and key projections."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def build_tiny_gguf(
    folder: Path, *, quantisation: str = "Q8_0", layers: int = 2, name: str = "tiny-llama"
) -> tuple[Path, Path]:
    """``(FILE.gguf, hf_directory)``: a tiny Llama written both ways into ``folder``."""
    import json

    import gguf
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    bos, eos, pad = (vocab[t] for t in SPECIAL)
    heads, kv_heads, hidden = 4, 2, 64
    cfg = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    hf_dir = folder / f"{name}-hf"
    model.save_pretrained(hf_dir)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    path = folder / f"{name}.{quantisation}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])  # control, normal
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(pad)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def put(gguf_name: str, array, quantise: bool = True) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quantise and quantisation != "F32" and array.ndim == 2:
            qtype = gguf.GGMLQuantizationType[quantisation]
            data = gguf.quants.quantize(array, qtype)
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, array)

    put("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(layers):
        hf = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", weights[hf + "input_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", _rotary_rows(weights[hf + "self_attn.q_proj.weight"], heads))
        put(
            f"blk.{i}.attn_k.weight",
            _rotary_rows(weights[hf + "self_attn.k_proj.weight"], kv_heads),
        )
        put(f"blk.{i}.attn_v.weight", weights[hf + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", weights[hf + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", weights[hf + "post_attention_layernorm.weight"])
        put(f"blk.{i}.ffn_gate.weight", weights[hf + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", weights[hf + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", weights[hf + "mlp.down_proj.weight"])
    put("output_norm.weight", weights["model.norm.weight"])
    put("output.weight", weights["lm_head.weight"])
    _finish(writer)
    return path, hf_dir


def write_gguf(path: Path, architecture: str, tensors: dict, raw_types: dict | None = None) -> Path:
    """A GGUF file of ``architecture`` holding ``tensors`` (name -> float32 array; a name in
    ``raw_types`` is written as raw bytes of that ggml type, unchecked): a file to refuse."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    for name, array in tensors.items():
        qtype = (raw_types or {}).get(name)
        if qtype is None:
            writer.add_tensor(name, np.asarray(array, dtype=np.float32))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            block, size = gguf.GGML_QUANT_SIZES[kind]
            shape = np.asarray(array).shape
            raw = np.zeros((*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=kind)
    _finish(writer)
    return path


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
