"""``launchspec.model_config``: what a model's config.json tells the argument checks (unit tests,
real files in a temporary folder)."""

from __future__ import annotations

import json

import pytest

from launchspec.model_config import is_causal_lm, is_causal_model, read_model_facts, tp_problems


def write_config(folder, config) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(config) if not isinstance(config, str) else config
    )


def test_a_causal_lm_whose_heads_the_tp_size_divides_passes(tmp_path):
    write_config(
        tmp_path,
        {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8, "num_key_value_heads": 4},
    )
    facts = read_model_facts(tmp_path)
    assert (facts.architecture, facts.kv_heads) == ("LlamaForCausalLM", 4)
    assert tp_problems(facts, 2, 1) == [] and tp_problems(facts, 4, 2) == []


def test_heads_the_tp_size_does_not_divide_are_named_with_the_fix(tmp_path):
    write_config(tmp_path, {"architectures": ["GPT2LMHeadModel"], "num_attention_heads": 3})
    [problem] = tp_problems(read_model_facts(tmp_path), 2, 1)
    assert "--tp-size 2 does not divide the model's 3 key/value heads" in problem
    assert "pass a tp size that divides 3" in problem


def test_an_encoder_cannot_take_tp_and_is_pointed_at_dp(tmp_path):
    write_config(tmp_path, {"architectures": ["BertModel"], "num_attention_heads": 12})
    [problem] = tp_problems(read_model_facts(tmp_path), 4, 1)
    assert "--tp-size 4 needs a causal LM" in problem and "BertModel encoder" in problem
    assert problem.endswith("serve it with --tp-size 1 and scale out with --dp-size 4")
    assert tp_problems(read_model_facts(tmp_path), 1, 1) == []


def test_an_unreadable_config_leaves_the_verdict_to_the_worker(tmp_path):
    write_config(tmp_path, "{not json")
    assert read_model_facts(tmp_path) is None
    assert tp_problems(None, 2, 1) == []
    write_config(tmp_path, {"model_type": "custom"})  # no architectures: nothing to say
    assert tp_problems(read_model_facts(tmp_path), 2, 1) == []


def test_a_model_whose_auto_map_names_a_causal_lm_class_generates(tmp_path):
    # The class name says nothing: auto_map says transformers loads it as a causal LM.
    write_config(
        tmp_path,
        {
            "architectures": ["BusyLlama"],
            "auto_map": {"AutoConfig": "busy.BusyConfig", "AutoModelForCausalLM": "busy.BusyLlama"},
        },
    )
    assert read_model_facts(tmp_path).causal


def test_auto_map_decides_by_the_entry_naming_the_architecture(tmp_path):
    both = {"AutoModel": "enc.Encoder", "AutoModelForCausalLM": "enc.EncoderForCausalLM"}
    assert not is_causal_model("Encoder", both)  # saved as the base model: embeddings
    assert is_causal_model("EncoderForCausalLM", both)
    assert not is_causal_model("Encoder", {"AutoModel": "enc.Encoder"})
    # An entry with the repository prefix, or a list (a tokenizer's), names its class the same.
    assert is_causal_model("Mine", {"AutoModelForCausalLM": "org/repo--modeling.Mine"})
    assert is_causal_model(None, {"AutoModelForCausalLM": "m.Mine", "AutoTokenizer": ["t.T", None]})
    write_config(tmp_path, {"architectures": ["BertModel"], "auto_map": {"AutoModel": "m.X"}})
    assert not read_model_facts(tmp_path).causal


@pytest.mark.e2e  # imports transformers' model tables: seconds, too slow for the fast loop
def test_class_names_are_judged_as_transformers_maps_them():
    """Every class of transformers' causal-LM mapping is a causal LM here, and no class of its
    base-model or masked-LM mappings that is not also in the causal one."""
    from transformers.models.auto import modeling_auto

    def classes(mapping) -> set[str]:
        names: set[str] = set()
        for value in mapping.values():
            names.update(value if isinstance(value, (list, tuple)) else [value])
        return names

    causal = classes(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    others = (
        classes(modeling_auto.MODEL_MAPPING_NAMES)
        | classes(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    ) - causal
    assert sorted(n for n in causal if not is_causal_lm(n)) == []
    assert sorted(n for n in others if is_causal_lm(n)) == []
