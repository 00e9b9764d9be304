"""Qwen3 in JAX (`qwen3`) and Hugging Face checkpoint conversion (`hf`)."""
