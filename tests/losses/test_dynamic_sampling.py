"""DAPO dynamic sampling: accumulate kept groups, truncate, and fail clearly when rewards are uniform."""

import numpy as np
import pytest

from pipo_jax.losses.dynamic_sampling import collect_filtered_groups

G = 2


def gen(batches):
    def next_batch(i):
        rewards = np.asarray(batches[i], np.float32)
        return {"seq_rewards_b": rewards, "row_id": np.arange(len(rewards)) + 100 * i,
                "tokens_bt": np.tile(np.arange(3), (len(rewards), 1)) + 100 * i}
    return next_batch


def test_accumulates_and_truncates():
    batches = [[1, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0]]  # kept groups: b0 g0; b1 g1, g2
    out, stats = collect_filtered_groups(gen(batches), train_batch_size=2, group_size=G)
    np.testing.assert_array_equal(out["row_id"], [0, 1, 102, 103])
    assert out["tokens_bt"].shape == (4, 3)
    assert stats == {"num_gen_batches": 2, "num_groups_seen": 6, "num_groups_kept": 3, "num_groups_dropped": 3}


def test_raises_after_max_num_gen_batches():
    batches = [[1, 1, 0, 0]] * 3
    with pytest.raises(RuntimeError, match="kept 0 of 6 groups after max_num_gen_batches=3"):
        collect_filtered_groups(gen(batches), train_batch_size=1, group_size=G, max_num_gen_batches=3)


def test_input_errors():
    with pytest.raises(KeyError, match="seq_rewards_b"):
        collect_filtered_groups(lambda i: {"r": np.zeros(2)}, train_batch_size=1, group_size=G)
    with pytest.raises(ValueError, match="field 'x'"):
        collect_filtered_groups(lambda i: {"seq_rewards_b": np.array([0.0, 1.0]), "x": np.zeros(3)},
                                train_batch_size=1, group_size=G)
