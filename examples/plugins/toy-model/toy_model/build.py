"""``python -m toy_model.build DIR --tokenizer-from PATH``: write a small ``ToyForCausalLM`` with
random weights to ``DIR``, with the tokenizer of the model directory at ``PATH``."""

import argparse

import torch
from transformers import AutoTokenizer

from toy_model.models.toy import ToyConfig, ToyForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--tokenizer-from", required=True)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_from)
    tokenizer.save_pretrained(args.dir)
    config = ToyConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.cls_token_id or tokenizer.bos_token_id,
        eos_token_id=tokenizer.sep_token_id or tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["ToyForCausalLM"],
    )
    torch.manual_seed(0)
    ToyForCausalLM(config).save_pretrained(args.dir)
    print(f"wrote a toy model to {args.dir}")


if __name__ == "__main__":
    main()
