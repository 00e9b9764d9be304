"""pipo_jax: RL post-training of Qwen3 with PIPO (arXiv 2604.00860) in JAX."""

__version__ = "0.1.0"
