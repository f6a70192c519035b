"""Loading a model's weights as the server arguments ask: the dtype (``weights.resolve_dtype``),
weight-only quantization (``weights.apply_scheme``) and a GGUF file's own quantized tensors
(``gguf_weights``); SGLang's ``model_loader`` room."""
