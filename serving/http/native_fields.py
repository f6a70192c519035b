"""SGLang's native ``/generate`` fields (as of SGLang 0.5.23), for refusing by name what this
server does not serve: every field of SGLang's ``GenerateReqInput`` and ``SamplingParams`` that
``serving.http.schemas`` does not declare, and any field SGLang does not have either."""

from __future__ import annotations

# SGLang's (0.5.23) fields of /generate's body and of its sampling_params: a field here that the
# structs of ``serving.http.schemas`` do not declare is refused by name (``refusal``), as is one
# SGLang lacks.
SGLANG_GENERATE_FIELDS = frozenset(
    "rid session_id text input_ids input_embeds image_data video_data audio_data mm_hashes "
    "mm_content_hashes use_audio_in_video video_config sampling_params watermark return_logprob "
    "logprob_start_len top_logprobs_num token_ids_logprob return_sampling_mask "
    "sampling_logprobs_mode return_text_in_logprobs return_flat_raw_top_logprobs "
    "return_flat_raw_output_top_logprobs return_flat_raw_top_logprobs_b64 stream log_metrics "
    "return_hidden_states return_routed_experts routed_experts_start_len return_indexer_topk "
    "modalities session_params lora_path lora_id custom_logit_processor "
    "positional_embed_overrides bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key "
    "decode_tp_size routed_dp_rank data_parallel_rank disagg_prefill_dp_rank routing_key "
    "conversation_id http_worker_ipc background require_reasoning max_thinking_tokens priority "
    "extra_key no_logs custom_labels return_bytes return_entropy return_prompt_token_ids "
    "external_trace_header received_time need_wait_for_mm_inputs num_items_assigned encoder_urls "
    "max_dynamic_patch min_dynamic_patch image_max_dynamic_patch video_max_dynamic_patch "
    "images_config mm_processor_kwargs multi_item_delimiter_indices token_indices_to_pool "
    "cache_salt kv_hints".split()
)
SGLANG_SAMPLING_FIELDS = frozenset(
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p "
    "frequency_penalty presence_penalty repetition_penalty min_new_tokens n beam_width "
    "json_schema regex ebnf structural_tag ignore_eos skip_special_tokens "
    "spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed "
    "custom_params".split()
)
# Fixes more precise than "leave it out", by field.
_NATIVE_FIXES = {
    "sampling_params.sampling_seed": "send sampling_params.seed instead",
    "input_ids": "send the prompt as text",
    "rid": "leave it out; meta_info.id names the request",
}


def refusal(name: str, at: str | None) -> tuple[str, str] | None:
    """The message and the field of the 400 for field ``name`` of ``/generate``'s body
    (``at``: None) or of its ``sampling_params``, which no struct declares; None elsewhere
    (msgspec names it)."""
    if at not in (None, "sampling_params"):
        return None
    param = f"{at}.{name}" if at else name
    known = SGLANG_SAMPLING_FIELDS if at else SGLANG_GENERATE_FIELDS
    fix = _NATIVE_FIXES.get(param, "leave it out")
    if name in known:
        return f"{param} is one of SGLang's fields that this server does not serve; {fix}", param
    return f"{param} is not a field of SGLang's /generate; check its spelling", param
