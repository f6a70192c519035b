"""Model layers the runtime provides to transformers models (SGLang's ``srt.layers``)."""
