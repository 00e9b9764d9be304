"""Kernels: fused LM head + log-softmax + gather (`logprobs`, `logprobs_pallas`) and the C++
XLA FFI kernels for decoding on the CPU (`cpu_ffi` builds them; `cpu_gemv`, `cpu_attention`)."""
