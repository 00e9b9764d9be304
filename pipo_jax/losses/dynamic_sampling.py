"""DAPO dynamic sampling (SPEC 1 "DAPO extras"), host side.

Generation batches of `gen_batch_size` prompts x G responses arrive one by one; groups whose
rewards are all equal are dropped (`advantages.dapo_group_filter`); kept groups are concatenated
until `train_batch_size` prompts are kept, then the result is truncated to exactly that many.
After `max_num_gen_batches` generation batches without enough kept groups a RuntimeError says so.

    batch, stats = collect_filtered_groups(next_batch, train_batch_size=, group_size=,
                                           max_num_gen_batches=10)

`next_batch(i)` returns the i-th generation batch as a mapping of arrays that all have the
response rows (P*G, contiguous groups) as leading axis and include `reward_key` [P*G].
`stats`: num_gen_batches, num_groups_seen, num_groups_kept (before truncation), num_groups_dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from pipo_jax.losses.advantages import dapo_group_filter


def collect_filtered_groups(
    next_batch: Callable[[int], Mapping[str, np.ndarray]],
    *,
    train_batch_size: int,
    group_size: int,
    max_num_gen_batches: int = 10,
    reward_key: str = "seq_rewards_b",
):
    """Accumulate kept groups until `train_batch_size` prompts; see the module docstring."""
    if train_batch_size < 1 or max_num_gen_batches < 1:
        raise ValueError(
            f"train_batch_size={train_batch_size} and max_num_gen_batches={max_num_gen_batches} must be >= 1"
        )
    pieces: list[dict] = []
    kept_prompts = seen = 0
    for i in range(max_num_gen_batches):
        batch = {k: np.asarray(v) for k, v in next_batch(i).items()}
        if reward_key not in batch:
            raise KeyError(f"generation batch {i} has no {reward_key!r}; keys: {sorted(batch)}")
        rows = batch[reward_key].shape[0]
        for k, v in batch.items():
            if v.shape[:1] != (rows,):
                raise ValueError(f"generation batch {i} field {k!r} has leading dim {v.shape[:1]}, expected {rows}")
        keep_p, keep_b, _ = dapo_group_filter(batch[reward_key], group_size)
        keep_b = np.asarray(keep_b)
        seen += rows // group_size
        kept_prompts += int(np.asarray(keep_p).sum())
        pieces.append({k: v[keep_b] for k, v in batch.items()})
        if kept_prompts >= train_batch_size:
            rows_needed = train_batch_size * group_size
            out = {k: np.concatenate([p[k] for p in pieces])[:rows_needed] for k in batch}
            stats = {
                "num_gen_batches": i + 1,
                "num_groups_seen": seen,
                "num_groups_kept": kept_prompts,
                "num_groups_dropped": seen - kept_prompts,
            }
            return out, stats
    raise RuntimeError(
        f"dynamic sampling kept {kept_prompts} of {seen} groups after max_num_gen_batches={max_num_gen_batches} "
        f"generation batches, fewer than train_batch_size={train_batch_size}: the rewards are too uniform "
        f"(all-correct or all-wrong groups); raise max_num_gen_batches or gen_batch_size"
    )
