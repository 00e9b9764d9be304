"""DAPO's dynamic sampling buffer: kept groups are appended in order and the batch is cut at P."""

import types

import jax.numpy as jnp
import numpy as np

from pipo_jax.losses import advantages
from pipo_jax.rl.rollout import merge_kept_groups

G, P = 2, 2
SPEC = types.SimpleNamespace(rollout=types.SimpleNamespace(group_size=G, prompts_per_batch=P))


def _batch(i, rewards):
    n = len(rewards)
    return {"rewards_b": jnp.asarray(rewards, jnp.float32), "row_id": jnp.arange(n) + 100 * i,
            "tokens_bt": jnp.tile(jnp.arange(3), (n, 1)) + 100 * i}


def _collect(batches):
    buffer = {"rewards_b": jnp.zeros(P * G), "row_id": jnp.full(P * G, -1), "tokens_bt": jnp.zeros((P * G, 3), jnp.int32)}
    filled = jnp.int32(0)
    for i, rewards in enumerate(batches):
        new = _batch(i, rewards)
        keep_p, _, _ = advantages.dapo_group_filter(new["rewards_b"], G)
        buffer, filled = merge_kept_groups(SPEC, buffer, filled, new, keep_p)
    return buffer, int(filled)


def reference(batches):
    """Concatenate the kept groups of every batch, then truncate to P groups."""
    rows = []
    for i, rewards in enumerate(batches):
        r = np.asarray(rewards).reshape(-1, G)
        for g in np.flatnonzero(r.max(1) != r.min(1)):
            rows += [100 * i + g * G + j for j in range(G)]
    return rows[: P * G]


def test_accumulates_in_order_and_truncates():
    batches = [[1, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0]]  # kept groups: batch 0 group 0; batch 1 groups 1, 2
    buffer, filled = _collect(batches)
    assert filled == 2
    np.testing.assert_array_equal(buffer["row_id"], [0, 1, 102, 103])
    np.testing.assert_array_equal(buffer["row_id"], reference(batches))
    np.testing.assert_array_equal(buffer["tokens_bt"][2], [100, 101, 102])
    np.testing.assert_array_equal(buffer["rewards_b"], [1, 0, 0, 1])


def test_partial_fill_keeps_count():
    batches = [[1, 1, 0, 0, 0, 1]]  # only the last group is informative
    buffer, filled = _collect(batches)
    assert filled == 1
    np.testing.assert_array_equal(buffer["row_id"][:2], [4, 5])
    np.testing.assert_array_equal(buffer["row_id"][2:], [-1, -1])  # untouched


def test_matches_reference_on_random_batches():
    rng = np.random.RandomState(0)
    for _ in range(20):
        batches = [list(rng.randint(0, 2, 6)) for _ in range(rng.randint(1, 4))]
        buffer, filled = _collect(batches)
        ref = reference(batches)
        assert filled == len(ref) // G
        np.testing.assert_array_equal(np.asarray(buffer["row_id"])[: len(ref)], ref)
