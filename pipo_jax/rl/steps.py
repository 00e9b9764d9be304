"""Pure update steps: mini-batch x epoch optimisation shared by the base, PI and critic updates.

`minibatch_updates` is the one machinery (docs/math.md §2: the PI step uses the *same* machinery
as the base step): shuffle per epoch, split into mini-batches (one optimizer step each)
and micro-batches (gradient accumulation). Loss counts (valid tokens, non-empty rows)
are taken over the whole mini-batch, so micro-batching never changes the loss or the
gradient. What differs between the updates is only the loss function and the learning
rate written into the shared optimizer state.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax

from pipo_jax import parallel
from pipo_jax.losses import pipo
from pipo_jax.losses.aggregation import aggregate, aggregation_counts
from pipo_jax.losses.kl import kl_loss
from pipo_jax.losses.value import clipped_value_loss
from pipo_jax.rl import algorithms
from pipo_jax.rl.batch import TrainBatch, rows_of
from pipo_jax.rl.hyper import Hyperparameters
from pipo_jax.rl.response_logprobs import response_hidden
from pipo_jax.rl.spec import ConfigError, TrainSpec

Batch = Any  # a pytree of `[rows, ...]` arrays: a `TrainBatch`, or VPD's E-step batch
LossFn = Callable[[Any, Batch, dict], tuple[jax.Array, dict]]


def minibatch_order(spec: TrainSpec, rng, batch_size: int) -> jax.Array:
    """Row indices `[epochs * n_mini, mini_batch]`: a fresh permutation per epoch when shuffling."""
    n_mini = batch_size // spec.mini_batch

    def epoch(key):
        return jax.random.permutation(key, batch_size) if spec.train.shuffle else jnp.arange(batch_size)

    orders = jax.vmap(epoch)(jax.random.split(rng, spec.train.epochs))
    return orders.reshape(spec.train.epochs * n_mini, spec.mini_batch)


def response_counts(mini: TrainBatch) -> dict:
    """Global counts of a mini-batch's response mask: {"num_tokens", "num_seqs"}; with SDPO
    teacher contexts also "sd": the counts of `mask * sd_mask`, which SDPO's loss averages over."""
    counts = aggregation_counts(mini.mask_br)
    if mini.sd_mask_b is not None:
        counts["sd"] = aggregation_counts(mini.mask_br * mini.sd_mask_b[:, None])
    return counts


def micro_rows_per_device(spec: TrainSpec, shards: int) -> int:
    """Sequences one device computes per micro-batch: `train.micro_batch_size_per_device`, or
    (0) the device's share of the mini-batch."""
    return spec.train.micro_batch_size_per_device or spec.mini_batch // shards


def check_micro_batching(spec: TrainSpec, shards: int) -> None:
    """Raises `ConfigError` naming the key unless `shards` devices split every mini-batch into
    whole per-device micro-batches."""
    per_device = micro_rows_per_device(spec, shards)
    if per_device < 1 or spec.mini_batch % (per_device * shards):
        raise ConfigError(
            f"config.train.micro_batch_size_per_device: {spec.train.micro_batch_size_per_device} x {shards} batch shards "
            f"(mesh axes of `batch`) does not divide the mini-batch of {spec.mini_batch} sequences")


def split_micro(x: jax.Array, n_micro: int, shards: int) -> jax.Array:
    """`[N, ...]` -> `[n_micro, N / n_micro, ...]` so that, with the rows split over `shards`
    devices in contiguous blocks, micro-batch i holds rows i*m..(i+1)*m of every device's block
    (m = N / (n_micro * shards)): each device computes only rows it already holds."""
    m = x.shape[0] // (n_micro * shards)
    x = x.reshape((shards, n_micro, m) + x.shape[1:]).swapaxes(0, 1)
    return parallel.constrain(x.reshape((n_micro, shards * m) + x.shape[3:]), (None, "batch") + (None,) * (x.ndim - 3))


def merge_micro(y: jax.Array, shards: int) -> jax.Array:
    """Inverse of `split_micro`: `[n_micro, shards * m, ...]` -> `[n_micro * shards * m, ...]` in row order."""
    n_micro, rows = y.shape[:2]
    y = y.reshape((n_micro, shards, rows // shards) + y.shape[2:]).swapaxes(0, 1)
    return parallel.constrain(y.reshape((n_micro * rows,) + y.shape[3:]), ("batch",) + (None,) * (y.ndim - 3))


def micro_split_count(spec: TrainSpec, rows: int) -> tuple[int, int]:
    """(micro-batches, batch shards) for `rows` sequences under the active sharding context."""
    shards = parallel.batch_shards()
    check_micro_batching(spec, shards)
    per_step = micro_rows_per_device(spec, shards) * shards
    if rows % per_step:
        raise ConfigError(f"config.train.micro_batch_size_per_device: {rows} rows do not split into micro-batches "
                          f"of {per_step} ({shards} batch shards)")
    return rows // per_step, shards


def map_micro_batches(spec: TrainSpec, fn: Callable[[Batch], Any], batch: Batch) -> Any:
    """`fn(micro_batch) -> tree of [rows, ...]` over `batch` one micro-batch at a time (`lax.map`,
    the update's micro-batch size per device), results back in row order `[B, ...]`.

    Peak memory is that of one micro-batch whatever the batch size, and each device computes
    only its own rows. For the no-gradient passes over a whole rollout (behaviour, reference
    and teacher log-probs, values, entropies).
    """
    n_micro, shards = micro_split_count(spec, jax.tree.leaves(batch)[0].shape[0])
    out = jax.lax.map(fn, jax.tree.map(lambda x: split_micro(x, n_micro, shards), batch))
    return jax.tree.map(lambda y: merge_micro(y, shards), out)


def accumulate_grads(spec: TrainSpec, loss_fn: LossFn, params, mini: Batch, counts: dict,
                     counts_fn: Callable[[Batch], dict] | None = None, rng=None) -> tuple[Any, dict]:
    """Summed gradients and metrics of `loss_fn` over the micro-batches of one mini-batch.

    `rng` (a key, or None): micro-batch i's `counts` carry "rng" = fold_in(rng, i), the key a
    loss with randomness draws from (Clip-Cov's random token selection); None: no "rng" entry.

    `pipo.authors.micro_token_mean` (verl's dp_actor, needs `counts_fn`): each micro-batch's
    loss over its own counts (`counts_fn(micro)`) times 1 / n_micro, not over the mini-batch's
    `counts`; the same as global counts when the micro-batches hold equal token / row counts
    (or there is one micro-batch). The counts cover the micro-batch's rows on every batch
    shard together (verl: per GPU, then averaged over GPUs; the same on one device).
    """
    n_micro, shards = micro_split_count(spec, jax.tree.leaves(mini)[0].shape[0])
    micros = jax.tree.map(lambda x: split_micro(x, n_micro, shards), mini)
    per_micro = spec.pipo_options.micro_token_mean and counts_fn is not None

    def keyed(c, i):
        return c if rng is None else dict(c, rng=jax.random.fold_in(rng, i))

    def micro_loss(p, micro, i):
        if not per_micro:
            return loss_fn(p, micro, keyed(counts, i))
        loss, metrics = loss_fn(p, micro, keyed(counts_fn(micro), i))
        return loss / n_micro, jax.tree.map(lambda m: m / n_micro, metrics)

    def micro_step(acc, xs):
        micro, i = xs
        (_, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, micro, i)
        return jax.tree.map(jnp.add, acc, (grads, metrics)), None

    zero_metrics = jax.eval_shape(lambda: micro_loss(params, jax.tree.map(lambda x: x[0], micros), 0)[1])
    zeros = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), zero_metrics))
    (grads, metrics), _ = jax.lax.scan(micro_step, zeros, (micros, jnp.arange(n_micro)))
    return grads, metrics


def minibatch_updates(spec: TrainSpec, loss_fn: LossFn, optimizer: optax.GradientTransformation, params, opt_state,
                      batch: Batch, rng, counts_fn: Callable[[Batch], dict] = response_counts,
                      compute=None) -> tuple[Any, Any, dict]:
    """Runs `epochs x (B / mini_batch)` optimizer steps of `loss_fn` on `batch`.

    `loss_fn(params, micro_batch, counts) -> (loss, metrics)` must aggregate with the
    mini-batch `counts = counts_fn(mini_batch)` (default: valid tokens and non-empty rows
    of `batch.mask_br`), so losses and metrics of micro-batches add up to the
    mini-batch's. Each mini-batch is split into micro-batches of
    `spec.train.micro_batch_size_per_device` rows per device (`accumulate_grads`). Returns (params,
    opt_state, metrics averaged over the optimizer steps, plus "grad_norm"). Each optimizer step's
    micro-batches get keys from `fold_in(rng, 1)` in `counts["rng"]` (`accumulate_grads`); `rng`
    itself orders the rows.

    `compute` (a traced bool, or None = always): when false, each optimizer step's forward and
    backward passes are skipped (`lax.cond`: zero gradients and metrics); an `optimizer` gated by
    the same flag (`make_optimizer(applies=...)`) then leaves params and state unchanged. Only the
    gradients leave the conditional: a `lax.cond` returning params and optimizer state holds them
    twice (its results beside its operands), which is what the PI step on an accelerator avoids.
    """
    size = rows_of(batch)
    order = minibatch_order(spec, rng, size)
    step_keys = jax.random.split(jax.random.fold_in(rng, 1), order.shape[0])

    def grads_of(p, mini, key):
        return accumulate_grads(spec, loss_fn, p, mini, counts_fn(mini), counts_fn, rng=key)

    def no_grads(p, mini, key):
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(grads_of, p, mini, key))

    def mini_step(carry, xs):
        p, s = carry
        idx, key = xs
        mini = jax.tree.map(lambda x: parallel.constrain(x[idx], ("batch",) + (None,) * (x.ndim - 1)), batch)
        if compute is None:
            grads, metrics = grads_of(p, mini, key)
        else:
            grads, metrics = jax.lax.cond(compute, grads_of, no_grads, p, mini, key)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
        updates, s = optimizer.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), metrics

    (params, opt_state), metrics = jax.lax.scan(mini_step, (params, opt_state), (order, step_keys))
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


# ----------------------------------------------------------------------------- losses


def _regularisers(spec: TrainSpec, hyper: Hyperparameters, logp_br, ent_br, mb: TrainBatch,
                  counts: dict) -> tuple[jax.Array, dict]:
    """KL-to-reference loss term and entropy bonus (each on when its `loss.*_coef` is nonzero: the spec's
    structure), weighted by `hyper.kl_coef` / `hyper.entropy_coef` (data)."""
    loss, metrics = 0.0, {}
    agg = algorithms.aggregation(spec, counts)
    if spec.loss.kl_coef > 0 and not spec.loss.kl_in_reward:
        kl, _ = kl_loss(logp_br, mb.logp_ref_br, mb.mask_br, estimator=spec.loss.kl_estimator, agg=agg)
        loss, metrics["kl_loss"] = loss + hyper.kl_coef * kl, kl
    if spec.loss.entropy_coef > 0:
        ent = aggregate(ent_br, mb.mask_br, agg)
        loss, metrics["entropy_loss"] = loss - hyper.entropy_coef * ent, ent
    return loss, metrics


def micro_teacher_logprobs(spec: TrainSpec, teacher_params, tokens_bq, mask_bq) -> jax.Array:
    """`algorithms.teacher_logprobs` over a whole batch `[B, R]`, one micro-batch at a time
    (`map_micro_batches`)."""
    return map_micro_batches(
        spec, lambda mb: algorithms.teacher_logprobs(spec, teacher_params, mb["tokens"], mb["mask"]),
        {"tokens": tokens_bq, "mask": mask_bq})


def base_loss_fn(spec: TrainSpec, teacher_params=None, *, hyper: Hyperparameters) -> LossFn:
    """The algorithm's loss on its own batch: the registered policy loss `spec.policy`
    (+ KL term, - entropy bonus), its clip and weights from `hyper` (`TrainState.hyper`). Distilling
    losses read `teacher_params`, or with `sdpo.teacher=live` the params being trained (under
    `stop_gradient`)."""

    def loss_fn(params, mb: TrainBatch, counts: dict):
        teacher = params if spec.live_teacher else teacher_params
        loss, metrics, logp, ent = spec.policy.fn(spec, params, teacher, mb, counts, hyper=hyper)
        reg, reg_metrics = _regularisers(spec, hyper, logp, ent, mb, counts)
        loss = loss + reg
        return loss, dict(metrics, **reg_metrics, loss=loss)

    return loss_fn


def pi_loss_fn(spec: TrainSpec, *, hyper: Hyperparameters) -> LossFn:
    """PIPO's verification loss on the stored batch: clipped surrogate with rhat (+ KL term).

    The ratio is the base loss's (`spec.pi_ratio`: GSPO's sequence ratio, else per token;
    `pipo.pi_ratio=token` per token), the clip the base loss's unless `pipo.pi_clip_low` /
    `pi_clip_high` are set (`hyper.pi_ratio_low` / `pi_ratio_high` hold the resolved bounds). The
    surrogate averages over all tokens of B_{t-1} (paper Eq. 11), with
    `pipo.sdpo_pi_denominator=signal_tokens` over the tokens of rows with a signal.
    The authors' token-ratio PI loss (`pi_no_lower_clip`, and `pi_symmetric_clip`: the upper bound
    1 + eps_low, resolved in `hyper.pi_ratio_bounds`) is their `grpo_layback`; algorithms declaring
    `authors_pi_token_loss=False` (PPO, whose PI step is their `ppo_layback`, the ordinary clip) keep
    the plain clip.
    """
    options = spec.pipo_options
    authors_token_loss = spec.algorithm.authors_pi_token_loss
    signal_tokens = spec.pipo.sdpo_pi_denominator == "signal_tokens"

    def loss_fn(params, mb: TrainBatch, counts: dict):
        logp, ent = algorithms.student_logprobs(spec, params, mb)
        chex.assert_equal_shape([logp, mb.logp_old_br, mb.rhat_br, mb.mask_br])
        # signal_tokens: the surrogate over the tokens of rows with a signal (`learn.pi_batch`
        # marks them in sd_mask_b); the KL term below stays over every token
        surrogate_counts = counts["sd"] if signal_tokens else counts
        loss, metrics = pipo.pi_surrogate_loss(
            logp, mb.logp_old_br, mb.rhat_br, mb.mask_br, ratio=spec.pi_ratio,
            ratio_low=hyper.pi_ratio_low, ratio_high=hyper.pi_ratio_high,
            no_lower_clip=options.pi_no_lower_clip and authors_token_loss,
            agg=algorithms.aggregation(spec, surrogate_counts))
        reg, reg_metrics = _regularisers(spec, hyper, logp, ent, mb, counts)
        loss = loss + reg
        return loss, dict(metrics, **reg_metrics, loss=loss)

    return loss_fn


def critic_values(spec: TrainSpec, critic_params, tokens_bl, mask_bl) -> jax.Array:
    """V(s_t) `[B, R]` float32: the value head on the critic backbone's response hidden states."""
    hidden = response_hidden(spec.model, critic_params["backbone"], tokens_bl, mask_bl, spec.prompt_len)
    values = jnp.einsum("brd,d->br", hidden.astype(jnp.float32), critic_params["value_head"])
    return jnp.where(mask_bl[:, spec.prompt_len:] > 0, values, 0.0)


def critic_loss_fn(spec: TrainSpec) -> LossFn:
    """PPO's clipped value loss."""

    def loss_fn(critic_params, mb: Batch, counts: dict):
        values = critic_values(spec, critic_params, mb.tokens_bl, mb.mask_bl)
        loss, metrics = clipped_value_loss(values, mb.values_br, mb.returns_br, mb.mask_br,
                                           cliprange_value=spec.critic.cliprange_value,
                                           agg=algorithms.aggregation(spec, counts))
        return loss, metrics

    return loss_fn
