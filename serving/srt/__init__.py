"""The SRT (text) runtime's worker: a scheduler per rank over a transformers model."""
