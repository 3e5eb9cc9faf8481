"""Export (`jax.export` artifacts, manifest, safetensors weights) and loading without model code."""
