"""The typed training batch: what `learn.prepare` builds from a rollout and the updates consume,
and (cut to `STORED_FIELDS` by `stored`) what PIPO keeps of it for the next PI step.

`TrainBatch` is a flax struct (a pytree: it rides through jit, `lax.scan`, `lax.map`
and `jax.tree.map` indexing as a dict did) with one field per array and `None` for the
fields an algorithm does not use. Shapes: B rows, L = P + R (prompt ++ response), R
response tokens, Q = the teacher context width + R.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TrainBatch:
    """B_t under theta_t (the base step's batch) or the stored B_{t-1} (the PI step's)."""

    tokens_bl: jax.Array  # int32 [B, L]: prompt (left-padded) ++ response (right-padded)
    mask_bl: jax.Array  # int32 [B, L]: attention mask
    mask_br: jax.Array  # float32 [B, R]: valid response tokens
    logp_old_br: jax.Array  # float32 [B, R]: behaviour log-probs (theta_t, tempered)
    logp_ref_br: jax.Array  # float32 [B, R]: the frozen reference's log-probs
    adv_br: Any = None  # float32 [B, R]: advantages (the base step's policy loss)
    rhat_br: Any = None  # float32 [B, R]: PIPO's c x stored attributions (the PI step's advantages)
    attr_br: Any = None  # float32 [B, R]: PIPO local attributions a_t (stored for the next PI step)
    values_br: Any = None  # float32 [B, R]: the critic's V(s_t) under theta_t (PPO)
    returns_br: Any = None  # float32 [B, R]: GAE returns, the critic's targets (PPO)
    teacher_tokens_bq: Any = None  # int32 [B, Q]: teacher context ++ response (SDPO, VPD)
    teacher_mask_bq: Any = None  # int32 [B, Q]
    logp_teacher_br: Any = None  # float32 [B, R]: the teacher's log-probs of the response
    sd_mask_b: Any = None  # float32 [B]: 1 where the teacher saw a solution or feedback
    rewards_b: Any = None  # float32 [B]: task rewards (VPD's E-step labels)
    global_adv_b: Any = None  # float32 [B]: COPO's global advantage (the row's prompt's, over the batch)
    local_weight_b: Any = None  # float32 [B]: COPO's weight of the local (group) advantage's loss
    adora_weight_b: Any = None  # float32 [B]: ADORA's weight of the row's prompt (1 or advantage.adora.tds_weight)

    @property
    def rows(self) -> int:
        return self.mask_br.shape[0]


STORED_FIELDS = ("tokens_bl", "mask_bl", "mask_br", "logp_old_br", "logp_ref_br", "attr_br")


def stored(batch: TrainBatch) -> TrainBatch:
    """B_t as PIPO stores it for the next PI step (`PipoState.prev`): the `STORED_FIELDS`
    (tokens, masks, behaviour / reference log-probs, attributions a_t), the others None."""
    return TrainBatch(**{f: getattr(batch, f) for f in STORED_FIELDS})


def stored_template(rows: int, seq_len: int, response_len: int) -> TrainBatch:
    """The stored batch's shapes and dtypes (`jax.ShapeDtypeStruct` leaves): B = `rows`,
    L = `seq_len` (prompt + response), R = `response_len`."""
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    b, L, r = rows, seq_len, response_len
    return TrainBatch(tokens_bl=i32(b, L), mask_bl=i32(b, L), mask_br=f32(b, r), logp_old_br=f32(b, r),
                      logp_ref_br=f32(b, r), attr_br=f32(b, r))


def check_batch(batch: TrainBatch) -> None:
    """chex shape / dtype assertions at a step boundary: every `[B, R]` field float32 and of
    the response mask's shape, `[B, L]` and `[B, Q]` pairs alike, `[B]` vectors of B rows."""
    b, r = batch.mask_br.shape
    chex.assert_shape([batch.tokens_bl, batch.mask_bl], (b, None))
    chex.assert_equal_shape([batch.tokens_bl, batch.mask_bl])
    per_token = [x for x in (batch.mask_br, batch.logp_old_br, batch.logp_ref_br, batch.adv_br, batch.rhat_br,
                             batch.attr_br, batch.values_br, batch.returns_br, batch.logp_teacher_br) if x is not None]
    chex.assert_shape(per_token, (b, r))
    chex.assert_type(per_token, jnp.float32)
    if batch.teacher_tokens_bq is not None:
        chex.assert_shape([batch.teacher_tokens_bq, batch.teacher_mask_bq], (b, None))
        chex.assert_equal_shape([batch.teacher_tokens_bq, batch.teacher_mask_bq])
    per_row = [x for x in (batch.sd_mask_b, batch.rewards_b, batch.global_adv_b, batch.local_weight_b,
                           batch.adora_weight_b) if x is not None]
    chex.assert_shape(per_row, (b,))


def rows_of(batch: Any) -> int:
    """Leading dimension shared by every leaf of a batch pytree."""
    return jax.tree.leaves(batch)[0].shape[0]
