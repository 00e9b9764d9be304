"""Kernels: fused LM head + log-softmax + gather (`logprobs`, `logprobs_pallas`)."""
