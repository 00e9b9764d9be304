"""Fused kernels: LM head + log-softmax + gather (`logprobs`)."""
