"""Kernels: fused LM head + log-softmax + gather (`logprobs`; its Pallas kernels `logprobs_pallas`, their shared
block math `softmax_stats`, the placement on a mesh `logprobs_sharded`)."""
