"""Tool calling's test material (no tests here): a chat template that renders tools in the
Qwen2.5 style (``<tool_call>`` JSON, tool results as ``<tool_response>``), written here, the
functions the tests offer, a check of arguments against their schemas, and a tiny model whose
tokenizer has that template."""

from __future__ import annotations

from pathlib import Path

# A template that reads ``tools`` and renders an assistant's earlier calls and the tools'
# answers, in the ChatML turns Qwen2.5's and SmolLM2's templates use.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\nYou may call one or more functions. Their signatures:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Answer a call with <tool_call>\n{"name": <function-name>, "arguments": <args-object>}\n'
    "</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% if m.content %}{{ m.content }}\n{% endif %}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n'
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "The sum of two small numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 9},
                "b": {"type": "boolean"},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def valid_arguments(tool: dict, arguments: dict) -> bool:
    """Whether ``arguments`` match ``tool``'s parameters (the keywords the tools above use:
    required, additionalProperties false, enum, integer bounds, boolean)."""
    schema = tool["function"]["parameters"]
    props = schema["properties"]
    if set(arguments) - set(props) or set(schema["required"]) - set(arguments):
        return False
    for key, value in arguments.items():
        rule = props[key]
        if "enum" in rule and value not in rule["enum"]:
            return False
        if rule["type"] == "boolean" and not isinstance(value, bool):
            return False
        if rule["type"] == "integer" and (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not rule["minimum"] <= value <= rule["maximum"]
        ):
            return False
        if rule["type"] == "string" and not isinstance(value, str):
            return False
    return True


def build_tool_model(path: Path) -> Path:
    """A Hugging Face model directory at ``path``: a tiny random-weight Llama with a byte-level
    BPE tokenizer (``support.structured.build_tiny_bpe_llama``) and ``TOOLS_TEMPLATE`` as its chat
    template."""
    from support.structured import build_tiny_bpe_llama

    return build_tiny_bpe_llama(path, seed=4321, template=TOOLS_TEMPLATE, positions=2048)
