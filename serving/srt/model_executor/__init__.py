"""What one forward of the generation model runs on (SGLang's ``srt.model_executor``)."""
