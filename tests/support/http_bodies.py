"""Request bodies the HTTP tests share (no tests here)."""

# Bodies a fault-injection run once saw answered with a plain-text 500: (route, body, param).
SEEN_AS_500 = [
    ("/v1/chat/completions", b'{"messages": "\\ud800"}', "messages"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "\\ud800"}',
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}',
        "\\ud800",
    ),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "\\ud800"}', "max_tokens"),
    ("/generate", b'{"text": "x", "sampling_params": "\\ud800"}', "sampling_params"),
    (
        "/generate",
        b'{"text": "x", "sampling_params": {"max_new_tokens": "\\ud800"}}',
        "sampling_params.max_new_tokens",
    ),
    ("/v1/embeddings", b'{"input": "x", "\\ud800": 1}', "\\ud800"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": "\\ud800"}', "dimensions"),
]
