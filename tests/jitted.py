"""The model's entry points compiled as one program per call shape, for tests that call them
outside a program.

Called eagerly, each operation of a forward compiles a program of its own (about 20 ms of XLA:CPU
and lowering each; the tiny model's forward and gradient are hundreds); under `jax.jit` a call
shape compiles once. The product always runs the model inside a program, so this is also the form
the tests should check."""

import jax

from pipo_jax.models import qwen3

logits = jax.jit(qwen3.logits, static_argnums=0)
hidden_states = jax.jit(qwen3.hidden_states, static_argnums=0)
forward = jax.jit(qwen3.forward, static_argnums=0, static_argnames="return_hidden")
