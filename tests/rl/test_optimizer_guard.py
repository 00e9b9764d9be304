"""`state.skip_nonfinite`: optax.apply_if_finite's rule and counts without its `lax.cond`, plus the
PI step's gate (a skipped update that counts nothing)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pipo_jax.rl.state import skip_nonfinite

PARAMS = {"w": jnp.array([[0.5, -1.0], [2.0, 0.25]]), "b": jnp.array([0.1, -0.3])}


def inner():
    return optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2))


def grads(scale, bad=None):
    g = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]) * scale, "b": jnp.array([0.2, -0.1]) * scale}
    if bad is not None:
        g["w"] = g["w"].at[0, 1].set(bad)
    return g


SEQUENCE = [grads(1.0), grads(0.5, jnp.nan), grads(2.0, jnp.inf), grads(-1.0), grads(0.3, -jnp.inf), grads(0.7)]


def run(opt, sequence, gates=None):
    p, s = PARAMS, opt(None).init(PARAMS)
    trace = []
    for i, g in enumerate(sequence):
        o = opt(None if gates is None else jnp.array(gates[i]))
        u, s = o.update(g, s, p)
        p = optax.apply_updates(p, u)
        trace.append((u, s, p))
    return trace


def test_equals_optax_apply_if_finite_update_for_update():
    ours = run(lambda gate: skip_nonfinite(inner(), gate), SEQUENCE)
    ref = run(lambda gate: optax.apply_if_finite(inner(), max_consecutive_errors=2**30), SEQUENCE)
    # Equal up to float32 rounding (XLA fuses the select into the update; optax runs a cond).
    for (u, s, p), (ru, rs, rp) in zip(ours, ref):
        for a, b in zip(jax.tree.leaves((u, s, p)), jax.tree.leaves((ru, rs, rp))):
            if jnp.issubdtype(a.dtype, jnp.floating):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
            else:
                np.testing.assert_array_equal(a, b)
    counts = [(int(s.notfinite_count), int(s.total_notfinite), bool(s.last_finite)) for _, s, _ in ours]
    assert counts == [(0, 0, True), (1, 1, False), (2, 2, False), (0, 2, True), (1, 3, False), (0, 3, True)]


def test_a_closed_gate_changes_nothing_and_counts_nothing():
    gates = [True, False, False, True, False, True]
    trace = run(lambda gate: skip_nonfinite(inner(), gate), SEQUENCE, gates)
    for i, (u, s, p) in enumerate(trace):
        if not gates[i]:
            _, s_prev, p_prev = trace[i - 1]
            assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(u))
            for a, b in zip(jax.tree.leaves((s, p)), jax.tree.leaves((s_prev, p_prev))):
                np.testing.assert_array_equal(a, b)
    # The gated sequence is the open one over the steps whose gate is open (finite 0, 3, 5).
    ref = run(lambda gate: skip_nonfinite(inner(), gate), [SEQUENCE[i] for i in (0, 3, 5)])
    for a, b in zip(jax.tree.leaves(trace[-1]), jax.tree.leaves(ref[-1])):
        np.testing.assert_array_equal(a, b)
    assert (int(trace[-1][1].total_notfinite), int(trace[-1][1].notfinite_count)) == (0, 0)
