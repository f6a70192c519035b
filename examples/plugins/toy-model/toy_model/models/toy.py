"""``ToyForCausalLM``: a Llama whose logits are soft-capped (``cap * tanh(logits / cap)``, as
Gemma 2 does), with a config of its own (``model_type`` ``"toy"``, ``logit_cap``), which
transformers does not know: sglang-launch reads it with the class's ``config_class``.

It is a transformers ``PreTrainedModel``: sglang-launch loads it with ``from_pretrained`` and
calls it as it calls transformers' own causal LMs (``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values``, ``use_cache``, ``logits_to_keep``; ``logits`` out).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class ToyConfig(LlamaConfig):
    model_type = "toy"

    def __init__(self, logit_cap: float = 30.0, **kwargs):
        self.logit_cap = logit_cap
        super().__init__(**kwargs)


class ToyForCausalLM(LlamaForCausalLM):
    config_class = ToyConfig

    def __init__(self, config: ToyConfig) -> None:
        super().__init__(config)
        # The cap applies to the head's output, so forward keeps Llama's signature (the runtime
        # reads its parameter names).
        self.lm_head.register_forward_hook(self._cap_logits)

    def _cap_logits(self, module, inputs, logits):
        cap = self.config.logit_cap
        return cap * torch.tanh(logits / cap)


EntryClass = ToyForCausalLM
