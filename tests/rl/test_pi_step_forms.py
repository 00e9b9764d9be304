"""The PI step's two forms, chosen by the target platform, both with the optimizer gated: on cuda / tpu
the gradients in a `lax.cond` (a skipped iteration computes no forward or backward pass; params and
optimizer state stay out of the conditional, which would hold them twice), on cpu no conditional (no
copies on XLA:CPU). Both give the same params, optimizer state and metrics: exactly when the step is
skipped, to float32 rounding when it is applied."""

import dataclasses
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.rl import controller, learn
from pipo_jax.rl import response_logprobs as logprobs
from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.experience import Rollout
from pipo_jax.rl.state import init_train_state
from tests.parallel.equivalence import UPDATE_RTOL
from tests.typed import spec_of

# Compiled once per form (spec and platform static; count and mu_t are array inputs).
_pi_step = jax.jit(learn.pi_step, static_argnums=(0, 6))


@pytest.fixture(scope="module")
def case():
    c = importlib.import_module("configs.grpo").get_config("micro")
    c.pipo.enabled = True
    c.pipo.window, c.pipo.lr, c.train.mini_batch_prompts = 4, 1e-4, 2  # two mini-batches: two updates
    spec = spec_of(c)
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0)
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(3, 20, (b, L)), jnp.int32)
    mask_l = jnp.ones((b, L), jnp.int32)
    logp_old, _ = jax.jit(logprobs.response_logprobs, static_argnums=(0, 4))(spec.model, state.params, tokens, mask_l,
                                                                            spec.prompt_len)
    attr = jnp.asarray(rng.randn(b, r), jnp.float32)
    stored = TrainBatch(tokens_bl=tokens, mask_bl=mask_l, mask_br=jnp.ones((b, r), jnp.float32),
                        logp_old_br=logp_old, logp_ref_br=logp_old, attr_br=attr)
    pipo_state = controller.PipoState(mu_window_k=jnp.array([0.2, 0.4, 0.2, 0.4]), count=jnp.int32(4),
                                      has_prev=jnp.bool_(True), prev=stored)
    return spec, state, pipo_state


def _both_forms(spec, state, pipo_state, mu_t):
    out = {}
    for platform in ("cpu", "tpu"):  # the tpu form (lax.cond) runs here too: the choice is the program's
        out[platform] = jax.device_get(_pi_step(spec, state.params, state.opt_state, pipo_state, jnp.float32(mu_t),
                                                jax.random.PRNGKey(1), platform, hyper=state.hyper))
    return out["cpu"], out["tpu"]


def _assert_same_step(cond, gated, before, lr, exact):
    """(params, opt_state, metrics) of the two forms: equal with `exact` (a skipped step: nothing is
    computed that could round), else as a sharded run is held equal to one device
    (tests/parallel/equivalence.py): the two forms are two programs, which XLA may fuse differently, so
    float32 sums may round differently and AdamW turns a rounding-level gradient element into a step of
    up to +-lr; a real difference (a step skipped, scaled or taken twice) changes the update by O(1)."""
    (p_cond, o_cond, m_cond), (p_gated, o_gated, m_gated) = cond, gated
    assert sorted(m_cond) == sorted(m_gated)
    if exact:
        jax.tree.map(np.testing.assert_array_equal, (p_cond, o_cond, m_cond), (p_gated, o_gated, m_gated))
        return
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=lr), p_cond, p_gated)
    for a, b in zip(jax.tree.leaves(o_cond), jax.tree.leaves(o_gated)):
        a, b = np.asarray(a), np.asarray(b)
        if np.issubdtype(b.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4 * float(np.max(np.abs(b), initial=0)))
        else:
            np.testing.assert_array_equal(a, b)
    for k in m_gated:
        np.testing.assert_allclose(m_cond[k], m_gated[k], rtol=1e-5, atol=1e-6, err_msg=k)
    diff = [np.asarray(a) - np.asarray(b) for a, b in zip(jax.tree.leaves(p_cond), jax.tree.leaves(p_gated))]
    update = [np.asarray(b) - np.asarray(p0) for b, p0 in zip(jax.tree.leaves(p_gated), jax.tree.leaves(before))]
    rel = np.sqrt(sum(float(np.sum(d ** 2)) for d in diff) / sum(float(np.sum(u ** 2)) for u in update))
    assert rel < UPDATE_RTOL, f"relative L2 difference of the two updates {rel:.3g}"


@pytest.mark.parametrize("iteration", ["applied", "warmup", "c_zero"])
def test_cond_form_equals_gated_form(case, iteration):
    spec, state, pipo_state = case
    mu_t = 0.3 if iteration == "c_zero" else 0.5  # window mean 0.3: xi = 0, c = 0
    if iteration == "warmup":  # the window not yet full: the first K iterations
        pipo_state = pipo_state.replace(count=jnp.int32(3))
    gated, cond = _both_forms(spec, state, pipo_state, mu_t)
    m_gated, (p_cond, o_cond, m_cond) = gated[2], cond
    applied = iteration == "applied"
    assert m_gated["pi_step_applied"] == m_cond["pi_step_applied"] == float(applied)
    before = jax.device_get(state.params)
    _assert_same_step(cond, gated, before, spec.pipo.lr, exact=not applied)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(p_cond), jax.tree.leaves(before)))
    if applied:
        assert moved > 0 and m_cond["c"] > 0 and np.isfinite(m_cond["pi/loss"]) and m_cond["pi/loss"] != 0
        assert int(o_cond.inner_state[1].count) == int(jax.device_get(state.opt_state).inner_state[1].count) + 2
    else:
        assert moved == 0 and m_cond["c"] == 0 and m_cond["pi/loss"] == 0
        jax.tree.map(np.testing.assert_array_equal, o_cond, jax.device_get(state.opt_state))


def _learn_step_text(platform: str) -> tuple[str, int, int]:
    """The whole learn step (prepare, PI step, base step) of the micro GRPO + PIPO preset,
    exported for `platform` from abstract inputs, how many params + optimizer state leaves it
    updates, and how many params leaves (the gradients) it has."""
    c = importlib.import_module("configs.grpo").get_config("micro")
    c.pipo.enabled = True
    spec = spec_of(c)
    spec = dataclasses.replace(spec, model=spec.model.replace(platform=platform))
    state = jax.eval_shape(lambda: init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0))
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    rollout = jax.eval_shape(lambda: Rollout(
        problems=rollout_lib.sample_problems(spec.generation, jax.random.PRNGKey(0), spec.rollout.prompts_per_batch,
                                             table=spec.task.prompt_table()),
        tokens_bl=jnp.zeros((b, L), jnp.int32), mask_bl=jnp.zeros((b, L), jnp.int32),
        sample_logp_br=jnp.zeros((b, r), jnp.float32), rewards_b=jnp.zeros((b,), jnp.float32)))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    fn = jax.jit(lambda s, ro, k: learn.learn(spec, s, ro, k))
    text = jax.export.export(fn, platforms=(platform,))(state, rollout, rng).mlir_module()
    return text, len(jax.tree.leaves((state.params, state.opt_state))), len(jax.tree.leaves(state.params))


def _state_conditionals(text: str, leaves: int) -> int:
    """Conditionals (`stablehlo.case` / `stablehlo.if`) whose results hold at least `leaves`
    values: with the params + optimizer state's count, one around an update; with the params'
    count, one around gradients too (the fused log-prob's small conditionals over a chunk return a
    few values)."""
    results = re.findall(r'%[\w#]+:(\d+) = "?stablehlo\.(?:case|if)', text)
    assert len(results) <= text.count("stablehlo.case") + text.count("stablehlo.if")
    return sum(int(n) >= leaves for n in results)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerator_learn_step_skips_the_pi_gradients_in_a_conditional_the_state_outside(platform):
    text, state_leaves, param_leaves = _learn_step_text(platform)
    assert _state_conditionals(text, state_leaves) == 0
    assert _state_conditionals(text, param_leaves) == 1  # the PI step's gradients (one scan body)


def test_cpu_learn_step_has_no_conditional_around_the_update():
    text, state_leaves, param_leaves = _learn_step_text("cpu")
    assert _state_conditionals(text, param_leaves) == 0
