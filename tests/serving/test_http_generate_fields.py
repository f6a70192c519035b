"""SGLang's native ``POST /generate`` over real HTTP (uvicorn on loopback, a scheduler stand-in on
a real ZeroMQ socket): ``sampling_params.n`` served as SGLang serves it (a list of ``n`` results,
sample ``i`` seeded ``seed + i``), refused with a stream or out of bounds; and every field of the
body and of ``sampling_params`` that this server does not declare refused by name with a 400,
whether SGLang has it or not (nothing is silently ignored)."""

from __future__ import annotations

import asyncio

from support.fake_scheduler import serve_app, token_text

from serving.http.native_fields import SGLANG_GENERATE_FIELDS, SGLANG_SAMPLING_FIELDS
from serving.http.schemas import GenerateRequest, NativeSamplingParams

SERVED = {"text", "sampling_params", "stream", "return_logprob", "top_logprobs_num"}
SERVED |= {"return_text_in_logprobs", "logprob_start_len"}
SERVED_SAMPLING = {"max_new_tokens", "n", "temperature", "top_p", "top_k", "stop"}
SERVED_SAMPLING |= {"ignore_eos", "presence_penalty", "frequency_penalty", "seed"}
# Served at the one value that is this server's behaviour, SGLang's default.
SERVED_SAMPLING |= {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
# Constrained decoding (issue 41): the grammar of the text.
SERVED_SAMPLING |= {"json_schema", "regex", "ebnf"}


def _post_all(tmp_path, bodies: list[dict]) -> tuple[list, list]:
    async def scenario():
        async with serve_app(tmp_path, loopback=True) as s:
            answers = [await s.http.post("/generate", json=b) for b in bodies]
            return answers, list(s.scheduler.generations)

    return asyncio.run(scenario())


def test_n_answers_a_list_of_n_samples_as_sglang_does(tmp_path):
    body = {"text": "hello", "sampling_params": {"n": 3, "max_new_tokens": 2, "seed": 40}}
    [r], sent = _post_all(tmp_path, [body])
    assert r.status_code == 200, r.text
    results = r.json()
    assert isinstance(results, list) and len(results) == 3
    assert [x["text"] for x in results] == [
        token_text(s, 0) + token_text(s, 1) for s in (40, 41, 42)
    ]
    assert [x["meta_info"]["completion_tokens"] for x in results] == [2, 2, 2]
    assert len({x["meta_info"]["id"] for x in results}) == 3
    assert [m.params.seed for m in sent] == [40, 41, 42] and {m.text for m in sent} == {"hello"}


def test_n_out_of_bounds_or_with_a_stream_is_a_400_naming_the_field(tmp_path):
    bodies = [
        {"text": "hello", "sampling_params": {"n": 1000}},
        {"text": "hello", "sampling_params": {"n": 0}},
        {"text": "hello", "stream": True, "sampling_params": {"n": 2}},
    ]
    answers, sent = _post_all(tmp_path, bodies)
    assert [a.status_code for a in answers] == [400, 400, 400]
    errors = [a.json()["error"] for a in answers]
    assert {e["param"] for e in errors} == {"sampling_params.n"}
    assert "at most 128" in errors[0]["message"] or "between 1 and 128" in errors[0]["message"]
    assert "send n: 1 with stream" in errors[2]["message"]
    assert sent == []  # nothing reached the scheduler


def test_every_field_sglang_has_is_served_or_refused_by_name(tmp_path):
    declared = set(GenerateRequest.__struct_fields__)
    declared_sampling = set(NativeSamplingParams.__struct_fields__)
    assert declared == SERVED and declared_sampling == SERVED_SAMPLING
    refused_top = sorted(SGLANG_GENERATE_FIELDS - declared) + ["not_a_field"]
    refused_sampling = sorted(SGLANG_SAMPLING_FIELDS - declared_sampling) + ["max_tokens"]
    bodies = [{"text": "hi", name: 1} for name in refused_top]
    bodies += [{"text": "hi", "sampling_params": {name: 1}} for name in refused_sampling]
    answers, sent = _post_all(tmp_path, bodies)
    params = ["sampling_params." + n for n in refused_sampling]
    for answer, param in zip(answers, refused_top + params, strict=True):
        assert answer.status_code == 400, (param, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and error["message"].startswith(param + " "), error
    messages = {a.json()["error"]["param"]: a.json()["error"]["message"] for a in answers}
    assert "does not serve" in messages["sampling_params.min_p"]
    assert "send sampling_params.seed instead" in messages["sampling_params.sampling_seed"]
    assert "not a field of SGLang's /generate" in messages["not_a_field"]
    assert "not a field of SGLang's /generate" in messages["sampling_params.max_tokens"]
    assert sent == []


def test_sglang_fields_at_this_servers_behaviour_are_served_and_other_values_refused(tmp_path):
    """An SGLang client that spells out its defaults is served; asking for what this server
    does not do is a 400 naming the field."""
    served = {"skip_special_tokens": True, "spaces_between_special_tokens": True}
    served["no_stop_trim"] = False
    refused = [("skip_special_tokens", False), ("no_stop_trim", True)]
    bodies = [{"text": "hi", "sampling_params": {**served, "max_new_tokens": 2}}]
    bodies += [{"text": "hi", "sampling_params": {name: value}} for name, value in refused]
    answers, sent = _post_all(tmp_path, bodies)
    assert answers[0].status_code == 200, answers[0].text
    for answer, (name, _) in zip(answers[1:], refused, strict=True):
        assert answer.status_code == 400 and answer.json()["error"]["param"] == (
            "sampling_params." + name
        ), answer.text
    assert len(sent) == 1
