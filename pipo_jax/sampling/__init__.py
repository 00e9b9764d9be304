"""Generation: JetStream-style engine over slots and the one-jit batched sampler."""
