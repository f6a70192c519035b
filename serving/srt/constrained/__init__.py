"""Constrained decoding: the grammar a request names (``SamplingParams.json_schema``, ``regex``
or ``ebnf``) limits the tokens its sequence may generate. ``base_grammar_backend`` is the seam
(SGLang's ``sglang.srt.constrained.base_grammar_backend``); ``xgrammar_backend`` the default
backend."""
