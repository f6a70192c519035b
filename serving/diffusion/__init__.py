"""The diffusion runtime's worker: an image scheduler per replica over a diffusers pipeline."""
