"""The shared test scenario: a micro GRPO + PIPO run whose PI step fires from iteration 1.

The PIPO window is pre-filled with two means (0.2, 0.4) and a stored previous batch
(random tokens, attribution +1 / -1 on alternate rows), so the verification step and
the base step both run in each of the `ITERATIONS` iterations. Used by the in-process
reference and by the 8-device and multi-process workers (which import it after
setting their XLA flags).
"""

from __future__ import annotations

import numpy as np
from tests.typed import spec_of

ITERATIONS = 2
SEED = 1
# Several PRNG keys give a micro rollout with all-zero rewards; this seed's rollouts
# have reward variance (checked by the reference test), so the base step has signal.


def config():
    from configs import grpo

    c = grpo.get_config("micro")
    c.pipo.enabled = True
    c.seed = SEED
    return c


def initial_state():
    """(spec, TrainState) on the default device."""
    import jax
    import jax.numpy as jnp

    from pipo_jax.models import qwen3
    from pipo_jax.rl import controller
    from pipo_jax.rl.batch import TrainBatch
    from pipo_jax.rl.state import init_train_state

    spec = spec_of(config())
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(SEED)), SEED)
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    rng = np.random.RandomState(SEED)
    tokens = rng.randint(3, spec.model.vocab_size, (b, L)).astype(np.int32)
    mask_r = np.ones((b, r), np.float32)
    mask_r[::3, r - 1] = 0.0  # some shorter responses
    attn = np.concatenate([np.ones((b, L - r), np.int32), mask_r.astype(np.int32)], axis=1)
    attr = np.where(np.arange(b)[:, None] % 2 == 0, 1.0, -1.0) * mask_r
    stored = TrainBatch(tokens_bl=jnp.asarray(tokens), mask_bl=jnp.asarray(attn),
                        mask_br=jnp.asarray(mask_r), logp_old_br=jnp.asarray(-3.5 * mask_r),
                        logp_ref_br=jnp.asarray(-3.5 * mask_r), attr_br=jnp.asarray(attr, jnp.float32))
    window = jnp.zeros((spec.pipo.window,), jnp.float32).at[-2:].set(jnp.array([0.2, 0.4]))
    ps = controller.PipoState(mu_window_k=window, count=jnp.int32(2), has_prev=jnp.bool_(True), prev=stored)
    return spec, state.replace(pipo=ps)


def flatten(tree) -> dict[str, np.ndarray]:
    """{'path': numpy leaf} of a pytree (for npz files and comparisons)."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def run_summary(state, metrics) -> dict[str, np.ndarray]:
    """What the tests compare: params, optimizer state, stored tokens, all metrics."""
    out = {f"params{k}": v for k, v in flatten(state.params).items()}
    out.update({f"opt{k}": v for k, v in flatten(state.opt_state).items()})
    out.update({f"pipo{k}": v for k, v in flatten(state.pipo).items()})
    out.update({f"metric/{k}": np.asarray(v) for k, v in metrics.items()})
    out["step"] = np.asarray(state.step)
    return out
