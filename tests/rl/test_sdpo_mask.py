"""SDPO / VPD: the teacher signal mask `sd_mask` (docs/math.md §1 "SDPO").

Rows whose teacher saw neither a sibling's solution nor feedback (sd_mask = 0) have no
attribution (paper Eq. 4: a = 0 there), in `learn.prepare` and in VPD's recompute after
the E-step, and the distillation loss is a token mean over `mask * sd_mask`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sdpo, vpd
from pipo_jax.rl import algorithms, learn, rollout, steps
from tests.rl.micro_trainer import fresh_state, learned, sampled

# micro: P = 4 prompts x G = 4. With feedback off, a row has a teacher signal only when another
# row of its group succeeded: group 0 -> rows 1-3 (row 0 is the only success), group 1 -> none,
# group 2 -> all four (two successes), group 3 -> none.
REWARDS = jnp.array([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0], jnp.float32)
SD_MASK = np.array([0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], np.float32)


def _setup(get_config):
    c = get_config("micro")
    c.sdpo.use_feedback = False  # the paper's SDPO setting
    c.pipo.enabled = True
    spec, state = fresh_state(c)
    return spec, state, rollout.with_rewards(sampled(spec, state.params, jax.random.PRNGKey(1)), REWARDS)


@pytest.fixture(scope="module")
def sdpo_token():
    def config(preset):
        c = sdpo.get_config(preset)
        c.loss.policy = "sdpo_token"
        return c

    spec, state, ro = _setup(config)
    batch, _, _ = jax.jit(lambda s, r: learn.prepare(spec, s, r))(state, ro)
    return spec, state, ro, batch


def _teacher_minus_student(spec, teacher, batch):
    logp_t = algorithms.teacher_logprobs(spec, teacher, batch.teacher_tokens_bq, batch.teacher_mask_bq)
    return np.asarray(logp_t - batch.logp_old_br)


def test_prepare_attribution_is_zero_without_teacher_signal(sdpo_token):
    spec, state, _, batch = sdpo_token
    np.testing.assert_array_equal(np.asarray(batch.sd_mask_b), SD_MASK)
    m = np.asarray(batch.mask_br)
    expected = _teacher_minus_student(spec, state.teacher_params, batch) * m * SD_MASK[:, None]
    attr = np.asarray(batch.attr_br)
    # the same XLA computation as prepare's: equal up to float32 rounding of a difference of log-probs
    np.testing.assert_allclose(attr, expected, atol=1e-5)
    assert np.all(attr[SD_MASK == 0] == 0.0)
    assert np.abs(expected[SD_MASK == 1]).sum() > 0  # the kept rows do carry a signal


def test_sdpo_token_mean_is_over_signal_tokens(sdpo_token):
    spec, state, _, batch = sdpo_token
    loss_fn = steps.base_loss_fn(spec, state.teacher_params, hyper=state.hyper)
    loss, _ = loss_fn(state.params, batch, steps.response_counts(batch))
    # plain reference: sg(logp_S - logp_T) * logp_S with IS weight min(exp(0), 2) = 1 (logp == logp_old
    # at theta_t), summed over mask * sd_mask and divided by that mask's token count
    logp_s = np.asarray(batch.logp_old_br, np.float64)
    logp_t = logp_s + _teacher_minus_student(spec, state.teacher_params, batch)
    w = np.asarray(batch.mask_br) * SD_MASK[:, None]
    expected = np.sum(w * (logp_s - logp_t) * logp_s) / np.sum(w)
    # float32 sums over ~100 tokens of terms of size ~10: relative error well below 1e-5
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


@pytest.mark.slow
def test_vpd_recomputed_attribution_is_zero_without_teacher_signal():
    spec, state, ro = _setup(vpd.get_config)
    assert spec.vpd.e_step and spec.pipo.attribution == "sdpo_token"
    new_state, _ = learned(spec, state, ro, jax.random.PRNGKey(2))
    stored = new_state.pipo.prev
    attr = np.asarray(stored.attr_br)
    assert np.all(attr[SD_MASK == 0] == 0.0)
    assert np.abs(attr[SD_MASK == 1]).sum() > 0
