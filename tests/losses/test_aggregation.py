"""Loss aggregation modes with hand-computed numbers, global counts and padding invariance."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses.aggregation import AGG_MODES, Aggregation, aggregate, aggregation_counts, token_mean

LOSS_BT = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 6.0, 9.0, 9.0], [7.0, 9.0, 9.0, 9.0]])
MASK_BT = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])  # row 2 is empty


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 6) / 5),  # 3.2
        ("seq-mean-token-mean", (6 / 3 + 10 / 2) / 2),  # 3.5; the empty row is not a sequence
        ("seq-mean-token-sum", (6 + 10) / 2),  # 8
        ("seq-mean-token-sum-norm", (6 + 10) / 4 / 2),  # 2, padded length R = 4
    ],
)
def test_modes_hand_computed(mode, expected):
    chex.assert_trees_all_close(aggregate(LOSS_BT, MASK_BT, Aggregation(mode)), jnp.float32(expected), rtol=1e-6)


def test_norm_length_and_global_counts():
    chex.assert_trees_all_close(aggregate(LOSS_BT, MASK_BT, Aggregation("seq-mean-token-sum-norm", norm_length=8)), 1.0)
    chex.assert_trees_all_close(aggregate(LOSS_BT, MASK_BT, Aggregation("token-mean", num_tokens=10)), 1.6)
    chex.assert_trees_all_close(aggregate(LOSS_BT, MASK_BT, Aggregation("seq-mean-token-mean", num_seqs=7)), 7.0 / 7)
    chex.assert_trees_all_close(aggregate(LOSS_BT, MASK_BT, Aggregation("seq-mean-token-sum", num_seqs=4)), 16.0 / 4)
    counts = aggregation_counts(MASK_BT)
    chex.assert_trees_all_close(counts, {"num_tokens": jnp.float32(5), "num_seqs": jnp.float32(2)})
    chex.assert_trees_all_close(token_mean(LOSS_BT, MASK_BT), 3.2)


def test_all_masked_gives_zero_not_nan():
    for mode in AGG_MODES:
        assert float(aggregate(LOSS_BT, jnp.zeros_like(MASK_BT), Aggregation(mode))) == 0.0


def test_nonfinite_padding_does_not_leak():
    loss = LOSS_BT.at[0, 3].set(jnp.inf).at[2, 0].set(jnp.nan)
    for mode in AGG_MODES:
        chex.assert_trees_all_close(aggregate(loss, MASK_BT, Aggregation(mode)), aggregate(LOSS_BT, MASK_BT, Aggregation(mode)))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_padding_invariance(mode):
    padded_loss = jnp.concatenate([LOSS_BT, jnp.full((3, 5), 123.0)], axis=1)
    padded_mask = jnp.concatenate([MASK_BT, jnp.zeros((3, 5), MASK_BT.dtype)], axis=1)
    extra_rows_loss = jnp.concatenate([padded_loss, jnp.full((2, 9), -7.0)], axis=0)
    extra_rows_mask = jnp.concatenate([padded_mask, jnp.zeros((2, 9), MASK_BT.dtype)], axis=0)
    norm = 4.0 if mode == "seq-mean-token-sum-norm" else None
    ref = aggregate(LOSS_BT, MASK_BT, Aggregation(mode, norm_length=norm))
    chex.assert_trees_all_close(aggregate(extra_rows_loss, extra_rows_mask, Aggregation(mode, norm_length=norm)), ref, rtol=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_sum_equals_mini_batch(mode):
    rng = np.random.default_rng(0)
    loss = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    mask = jnp.asarray(rng.random((6, 5)) < 0.6, jnp.float32).at[4].set(0.0)
    counts = aggregation_counts(mask)
    full = aggregate(loss, mask, Aggregation(mode))
    pieces = [slice(0, 1), slice(1, 4), slice(4, 6)]
    summed = sum(aggregate(loss[s], mask[s], Aggregation.of(mode, counts)) for s in pieces)
    chex.assert_trees_all_close(summed, full, rtol=1e-5, atol=1e-6)


def test_bad_mode_names_the_field():
    with pytest.raises(ValueError, match="loss_agg_mode='seq-mean'"):
        Aggregation("seq-mean")
