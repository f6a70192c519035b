"""A tiny random-weight Llama whose tokenizer is byte-level BPE (no tests here).

Constrained decoding checks that the *text* follows a grammar, so the model's tokens must
decode to exactly the characters the grammar matched: a byte-level BPE tokenizer (GPT-2's kind,
SmolLM2's and Qwen2.5's) does, where the suite's other tiny Llama, with BERT's WordPiece
tokenizer, puts spaces between its tokens. The tokenizer is trained here on a few sentences
(``support.gguf.train_tokenizer``); every byte is in its vocabulary, so any text encodes.
"""

from __future__ import annotations

from pathlib import Path

# The chat template of the model directory (the assistant's turn is ended by </s>, its EOS).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# The tokens that end a JSON string, array or object, and their weights on the constant
# dimension (``closing_bias`` times these): a quote before a bracket before a brace, so a string
# closes before a "}" inside it could run on, and an array or object closes once it may.
CLOSING = {'"': 1.0, "]": 0.9, "}": 0.8}


def build_tiny_bpe_llama(
    path: Path,
    layers: int = 2,
    seed: int = 1234,
    closing_bias: float = 0.0,
    template: str = CHAT_TEMPLATE,
    positions: int = 1024,
) -> Path:
    """A Hugging Face model directory at ``path``: a tiny Llama (random weights from ``seed``,
    ``positions`` positions) with a byte-level BPE tokenizer (``support.gguf.train_tokenizer``:
    its tokens decode to exactly the text a grammar matched) and ``template`` as its chat
    template.

    ``closing_bias`` > 0 makes the tokens of ``CLOSING`` likelier than the rest at every step
    (one embedding dimension is a constant, which the output rows of those tokens weigh by
    ``closing_bias``): a JSON string, object or array that its grammar keeps open then closes
    within a few tokens, where a plain random model wanders on for hundreds. The other weights
    stay random, so which of them comes first still varies."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from support.gguf import train_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    tok.chat_template = template
    tok.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if closing_bias:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 1.0
            for token, weight in CLOSING.items():
                row = tok.convert_tokens_to_ids(token)
                model.lm_head.weight[row, 0] += closing_bias * weight
    model.save_pretrained(path)
    return path
