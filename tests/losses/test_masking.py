"""Masked reductions: hand-computed numbers."""

import chex
import jax.numpy as jnp

from pipo_jax.losses import masking

X = jnp.array([[1.0, 2.0, 30.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]])
M = jnp.array([[True, True, False], [True, False, False], [False, False, False]])


def test_masked_reductions():
    assert masking.as_mask(M).dtype == jnp.float32
    chex.assert_trees_all_close(masking.masked_mean(X, M), jnp.float32(7.0 / 3))
    chex.assert_trees_all_close(masking.masked_mean(X, M, axis=-1), jnp.array([1.5, 4.0, 0.0]))
    chex.assert_trees_all_close(masking.last_valid_index(M), jnp.array([1, 0, -1], jnp.int32))
    chex.assert_trees_all_close(masking.last_valid_index(jnp.array([[1, 0, 1, 0]])), jnp.array([2], jnp.int32))
