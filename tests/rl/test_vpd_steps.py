"""VPD E-step (docs/math.md §4): config validation, the F schedule, the outcome count mask, the
reference choice, and `e_step` on a micro SDPO batch built by the trainer's own pieces
(rollout.collect -> learn.prepare). The micro model compiles slowly on a shared CPU, so
one jitted `maybe_e_step` is built per module and reused."""

import dataclasses
import itertools
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import sdpo
from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.rl import learn
from pipo_jax.rl import vpd_estep as vpd
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_teacher_opt_state, skip_nonfinite
from tests.rl.micro_trainer import collected, fresh_state

# ----------------------------------------------------------------------------- config and schedule


def _batch(mask_br, **fields) -> TrainBatch:
    """A `TrainBatch` with the response mask `mask_br` [B, R], zeros elsewhere, and `fields`."""
    b, r = mask_br.shape
    zeros = dict(tokens_bl=jnp.zeros((b, r + 1), jnp.int32), mask_bl=jnp.ones((b, r + 1), jnp.int32),
                 logp_old_br=jnp.zeros((b, r)), logp_ref_br=jnp.zeros((b, r)))
    return TrainBatch(mask_br=mask_br, **{**zeros, **fields})


def test_config_defaults():
    cfg = vpd.VpdConfig()
    assert (cfg.beta, cfg.every, cfg.e_step, cfg.reference, cfg.delta_mode, cfg.seq_logprob, cfg.hybrid) == (
        0.1, 5, True, "dynamic", "cumulative", "sum", "none")
    assert hash(cfg) == hash(vpd.VpdConfig())  # jit-static


@pytest.mark.parametrize("field, value", [
    ("beta", 0.0), ("beta", float("nan")), ("every", 0), ("every", 2.5), ("lr", -1e-6), ("e_step", "yes"),
    ("reference", "initial"), ("delta_mode", "median"), ("delta_ema_rate", 0.0), ("delta_ema_rate", 1.5),
    ("seq_logprob", "max"), ("hybrid", "both"), ("hybrid_weight", -0.1),
])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"config\.vpd\.{field}: "):
        vpd.VpdConfig(**{field: value})


def test_config_from_ml_collections_section():
    section = ml_collections.ConfigDict({"beta": 0.2, "every": 3, "reference": "fixed", "hybrid": "reshape"})
    cfg = vpd.VpdConfig.from_config(section)
    assert (cfg.beta, cfg.every, cfg.reference, cfg.hybrid, cfg.lr) == (0.2, 3, "fixed", "reshape", 1e-6)
    with pytest.raises(ConfigError, match=r"config\.vpd\.betta: unknown key"):
        vpd.VpdConfig.from_config({"betta": 0.2})


def test_should_run_every_f_student_steps():
    steps_ = np.arange(12)
    np.testing.assert_array_equal(np.nonzero([bool(vpd.should_run(s, 5)) for s in steps_])[0], [0, 5, 10])
    assert all(bool(vpd.should_run(s, 1)) for s in steps_)
    jitted = jax.jit(lambda s: vpd.should_run(s, 4))
    np.testing.assert_array_equal([bool(jitted(jnp.int32(s))) for s in steps_], steps_ % 4 == 0)
    with pytest.raises(ValueError, match="every=0"):
        vpd.should_run(3, 0)


def test_outcome_counts_are_the_labelled_rows_of_a_mini_batch():
    rng = np.random.default_rng(0)
    pos = rng.random(32) < 0.3
    neg = ~pos & (rng.random(32) < 0.7)
    batch = vpd.e_step_batch(_batch(jnp.ones((32, 2)), teacher_tokens_bq=jnp.zeros((32, 3), jnp.int32),
                                    teacher_mask_bq=jnp.ones((32, 3), jnp.int32)), jnp.zeros((32, 2)), pos, neg)
    for _ in range(5):
        rows = rng.permutation(32)[:8]
        counts = vpd.outcome_counts(jax.tree.map(lambda v: v[rows], batch))
        assert (float(counts["num_pos"]), float(counts["num_neg"])) == (pos[rows].sum(), neg[rows].sum())


def test_labels_need_teacher_signal_and_a_response():
    spec = SimpleNamespace(sdpo=SimpleNamespace(success_threshold=1.0))
    batch = _batch(jnp.array([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0]], jnp.float32),
                   rewards_b=jnp.array([1.0, 0.0, 1.0, 0.0, 1.0]), sd_mask_b=jnp.array([1.0, 1.0, 0.0, 0.0, 1.0]))
    pos, neg = vpd.labels(spec, batch)
    np.testing.assert_array_equal(pos, [True, False, False, False, False])
    np.testing.assert_array_equal(neg, [False, True, False, False, False])
    with pytest.raises(KeyError, match="rewards_b"):
        vpd.labels(spec, batch.replace(rewards_b=None))


def test_reference_logprobs_dynamic_is_the_current_student_fixed_the_initial_policy():
    batch = _batch(jnp.ones((1, 2)), logp_old_br=jnp.array([[-1.0, -2.0]]), logp_ref_br=jnp.array([[-3.0, -4.0]]))
    np.testing.assert_array_equal(vpd.reference_logprobs(vpd.VpdConfig(), batch), batch.logp_old_br)
    np.testing.assert_array_equal(vpd.reference_logprobs(vpd.VpdConfig(reference="fixed"), batch),
                                  batch.logp_ref_br)
    g = jax.grad(lambda x: jnp.sum(vpd.reference_logprobs(vpd.VpdConfig(), batch.replace(logp_old_br=x))))(batch.logp_old_br)
    np.testing.assert_array_equal(g, 0.0)
    with pytest.raises(KeyError, match="logp_ref_br"):
        vpd.reference_logprobs(vpd.VpdConfig(reference="fixed"), batch.replace(logp_ref_br=None))


# ----------------------------------------------------------------------------- e_step on a micro batch

PATTERN = jnp.tile(jnp.array([1.0, 0.0, 0.0, 1.0]), 4)  # two successes per group of G = 4: both BCO terms act


@pytest.fixture(scope="module")
def micro():
    c = sdpo.get_config("micro")
    spec, state = fresh_state(c)
    ro = collected(spec, state.params, jax.random.PRNGKey(1))
    batch, _, _ = jax.jit(lambda s, r: learn.prepare(spec, s, r))(state, ro)
    batch = batch.replace(rewards_b=ro.rewards_b)
    cfg = vpd.VpdConfig(lr=1e-3, every=5)

    @jax.jit
    def run(teacher, opt_state, b, ref, delta, rng, step):
        return vpd.maybe_e_step(spec, cfg, step, teacher, opt_state, b, ref, delta, rng)

    logq = jax.jit(lambda t, b: vpd.teacher_response_logprobs(spec, t, b.teacher_tokens_bq, b.teacher_mask_bq))
    return SimpleNamespace(spec=spec, state=state, batch=batch, cfg=cfg, run=run, logq=logq,
                           opt0=init_teacher_opt_state(spec, cfg, state.teacher_params))


def _np_rtilde_mean(logq, ref, batch, beta):
    """Plain numpy: beta * sum_t m (logq - ref) per row, averaged over rows with teacher signal."""
    m = np.asarray(batch.mask_br)
    r = beta * np.sum(m * (np.asarray(logq) - np.asarray(ref)), axis=1)
    labelled = (np.asarray(batch.sd_mask_b) > 0) & (m.sum(1) > 0)
    return r[labelled].mean()


def _max_diff(a, b):
    diff = lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))  # noqa: E731
    return max(jax.tree.leaves(jax.tree.map(diff, a, b)))


@pytest.mark.parametrize("reference", ["dynamic", "fixed"])
def test_e_step_trains_the_teacher_only_and_sets_delta(micro, reference):
    batch = micro.batch.replace(rewards_b=PATTERN)
    # At init the student *is* the initial policy; shift the fixed reference so the two choices differ.
    batch = batch.replace(logp_ref_br=batch.logp_old_br - 0.3 * batch.mask_br)
    ref = vpd.reference_logprobs(dataclasses.replace(micro.cfg, reference=reference), batch)
    student_before = jax.tree.map(np.array, micro.state.params)
    teacher_before = micro.state.teacher_params
    t, s, d, m = micro.run(teacher_before, micro.opt0, batch, ref, vpd_loss.init_delta_state(),
                           jax.random.PRNGKey(2), 0)
    assert float(m["vpd/e_step_applied"]) == 1.0
    # the teacher moved, by Adam steps of the teacher's lr (1e-3; the student's is 1e-4): |step| <~ lr each
    assert 0.5 * micro.cfg.lr < _max_diff(t, teacher_before) < 2.5 * micro.cfg.lr
    assert _max_diff(micro.state.params, student_before) == 0.0  # the student did not
    assert int(s.inner_state[1].count) == 2  # two optimizer steps: B = 16, mini-batch 8, one epoch
    # delta after the first update (cumulative from the initial state) = mean implicit reward before the update
    expected = _np_rtilde_mean(micro.logq(teacher_before, batch), ref, batch, micro.cfg.beta)
    assert float(m["vpd/rtilde_mean"]) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert float(d.delta) == pytest.approx(expected, rel=1e-4, abs=1e-6) and int(d.count) == 1
    if reference == "fixed":  # beta * 0.3 * |y| more than the dynamic reference
        dyn = _np_rtilde_mean(micro.logq(teacher_before, batch), batch.logp_old_br, batch, micro.cfg.beta)
        lengths = np.asarray(batch.mask_br).sum(1)[np.asarray(batch.sd_mask_b) > 0]
        assert expected - dyn == pytest.approx(0.1 * 0.3 * lengths.mean(), rel=1e-4)
    assert (float(m["vpd/num_pos"]), float(m["vpd/num_neg"])) == (8.0, 8.0)
    assert all(np.isfinite(float(v)) for v in m.values())


def test_e_step_loss_decreases_on_a_fixed_batch(micro):
    batch = micro.batch.replace(rewards_b=PATTERN)
    ref = batch.logp_old_br
    t, s, d = micro.state.teacher_params, micro.opt0, vpd_loss.init_delta_state()
    losses, accuracy = [], []
    for i in range(4):
        t, s, d, m = micro.run(t, s, batch, ref, d, jax.random.PRNGKey(10 + i), 0)
        losses.append(float(m["vpd/e_loss"]))
        accuracy.append(float(m["vpd/e_accuracy"]))
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.85 * losses[0], losses
    assert accuracy[-1] > accuracy[0], accuracy
    assert float(m["vpd/rtilde_pos"]) > float(m["vpd/rtilde_neg"])  # the teacher separates the outcomes
    assert int(d.count) == 4


def test_e_step_with_the_rollout_rewards_and_no_positives_is_finite(micro):
    t, _, _, m = micro.run(micro.state.teacher_params, micro.opt0, micro.batch, micro.batch.logp_old_br,
                           vpd_loss.init_delta_state(), jax.random.PRNGKey(3), 0)
    rewards = np.asarray(micro.batch.rewards_b)
    assert float(m["vpd/num_pos"]) == float(np.sum(rewards >= 1.0))
    assert float(m["vpd/num_pos"]) + float(m["vpd/num_neg"]) == float(np.sum(np.asarray(micro.batch.sd_mask_b)))
    if float(m["vpd/num_pos"]) == 0:
        assert float(m["vpd/e_loss_pos"]) == 0.0
    assert all(np.isfinite(float(v)) for v in m.values())
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(t))


def test_e_step_is_skipped_between_schedule_points_and_absent_when_off(micro):
    batch = micro.batch.replace(rewards_b=PATTERN)
    delta = vpd_loss.DeltaState(delta=jnp.float32(0.25), count=jnp.int32(3))
    t, s, d, m = micro.run(micro.state.teacher_params, micro.opt0, batch, batch.logp_old_br, delta,
                           jax.random.PRNGKey(4), 1)  # every = 5: step 1 is not a schedule point
    assert float(m["vpd/e_step_applied"]) == 0.0 and float(m["vpd/delta"]) == 0.25
    assert _max_diff(t, micro.state.teacher_params) == 0.0 and _max_diff(s, micro.opt0) == 0.0
    assert (float(d.delta), int(d.count)) == (0.25, 3)
    off = dataclasses.replace(micro.cfg, e_step=False)
    out = vpd.maybe_e_step(micro.spec, off, 0, micro.state.teacher_params, micro.opt0, batch, None, delta,
                           jax.random.PRNGKey(4))
    assert out[0] is micro.state.teacher_params and out[1] is micro.opt0 and out[2] is delta and out[3] == {}
    fixed = dataclasses.replace(micro.cfg, reference="fixed")  # an explicit reference would silently bypass it
    with pytest.raises(ValueError, match="reference='fixed'"):
        vpd.e_step(micro.spec, fixed, micro.state.teacher_params, micro.opt0, batch, batch.logp_old_br, delta,
                   jax.random.PRNGKey(4))


def _sgd(lr, spec):
    """`make_teacher_optimizer` with plain SGD in AdamW's place (same clip and non-finite guard, same
    `with_lr` state layout)."""
    return skip_nonfinite(optax.chain(
        optax.clip_by_global_norm(spec.train.grad_clip), optax.inject_hyperparams(optax.sgd)(learning_rate=lr)))


def test_micro_batching_does_not_change_the_e_step(micro, monkeypatch):
    """Micro-batches accumulate the mini-batch gradient with the mini-batch's outcome counts, so the
    E-step is the same up to float32 summation order. The update is compared under SGD, where it is
    -lr * (clipped) gradient: under Adam an element whose gradient is a rounding-level cancellation
    steps by about +-lr with a sign set by that rounding, so parameters after an Adam step differ
    by codegen noise of size lr (3e-5 seen on one CPU, 0 on another)."""
    monkeypatch.setattr(vpd, "make_teacher_optimizer", lambda spec, cfg: _sgd(cfg.lr, spec))
    batch = micro.batch.replace(rewards_b=PATTERN)
    teacher = micro.state.teacher_params
    opt0 = _sgd(micro.cfg.lr, micro.spec).init(teacher)
    spec2 = micro.spec.with_section("train", micro_batch_size_per_device=micro.spec.mini_batch // 2)
    step = lambda spec: jax.jit(lambda t, s, b, d, k: vpd.e_step(spec, micro.cfg, t, s, b, None, d, k))  # noqa: E731
    split, whole = (step(s)(teacher, opt0, batch, vpd_loss.init_delta_state(), jax.random.PRNGKey(5))
                    for s in (spec2, micro.spec))  # ref None: read logp_old_br ("dynamic")
    # Recursive float32 summation of n terms errs by at most (n - 1) * eps * sum|terms|. The
    # gradient sums, over the mini-batch's teacher tokens (n), terms of the size of the whole
    # update (the update itself can be a near-cancellation: at init the teacher is the student,
    # rtilde ~ 0, and the positive and negative rows pull with sigma(0) each), so each entry of
    # the update may move by n * eps * |update|_2 when the sum is split in two; plus one float32
    # spacing of the parameter, as theta + update is rounded to it. (Measured: 0.12 of the bound,
    # with and without XLA_FLAGS=--xla_cpu_max_isa=AVX2.)
    n = micro.spec.mini_batch * batch.teacher_tokens_bq.shape[1]
    u_split, u_whole = (jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b), out[0], teacher)
                        for out in (split, whole))
    norm = np.sqrt(sum(np.sum(u ** 2) for u in jax.tree.leaves(u_whole)))
    assert norm > 0
    for a, b, p in zip(*map(jax.tree.leaves, (u_split, u_whole, teacher))):
        bound = n * np.finfo(np.float32).eps * norm + np.spacing(np.abs(np.asarray(p)))
        assert np.all(np.abs(a - b) <= bound), np.max(np.abs(a - b) / bound)
    for key in ("vpd/e_loss", "vpd/e_accuracy", "vpd/rtilde_pos", "vpd/rtilde_neg", "vpd/delta", "vpd/grad_norm"):
        assert float(split[3][key]) == pytest.approx(float(whole[3][key]), rel=1e-4, abs=1e-6), key


def test_teacher_diagnostics_match_a_full_batch_computation(micro):
    spec, batch = micro.spec, micro.batch
    teacher = jax.tree.map(lambda x: x * 1.5, micro.state.teacher_params)  # a sharper teacher
    got, got4 = jax.jit(lambda t, s, b: (vpd.teacher_diagnostics(spec, t, s, b),  # micro-batches of 8 (the mini-batch)
                                         vpd.teacher_diagnostics(spec, t, s, b, chunk_rows=4)))(
        teacher, micro.state.params, batch)
    chex.assert_trees_all_close(got, got4, rtol=1e-5)
    with pytest.raises(ValueError, match="chunk_rows=3"):
        vpd.teacher_diagnostics(spec, teacher, micro.state.params, batch, chunk_rows=3)

    @jax.jit
    def full(t, s, b):
        from pipo_jax.rl import response_logprobs as logprobs
        q = b.teacher_tokens_bq.shape[1] - spec.rollout.max_new_tokens
        t_btv = logprobs.response_log_softmax(spec.model, t, b.teacher_tokens_bq, b.teacher_mask_bq, q,
                                              temperature=spec.rollout.temperature)
        s_btv = logprobs.response_log_softmax(spec.model, s, b.tokens_bl, b.mask_bl, spec.prompt_len,
                                              temperature=spec.rollout.temperature)
        return t_btv, s_btv

    t_btv, s_btv = map(np.asarray, full(teacher, micro.state.params, batch))
    m = np.asarray(batch.mask_br) * np.asarray(batch.sd_mask_b)[:, None]
    pt, ps = np.exp(t_btv), np.exp(s_btv)
    h_t = -np.sum(pt * t_btv, -1)
    kl = np.sum(pt * (t_btv - s_btv), -1)
    assert float(got["vpd/teacher_entropy"]) == pytest.approx((h_t * m).sum() / m.sum(), rel=1e-4)
    assert float(got["vpd/student_entropy"]) == pytest.approx((-np.sum(ps * s_btv, -1) * m).sum() / m.sum(),
                                                              rel=1e-4)
    assert float(got["vpd/kl_teacher_student"]) == pytest.approx((kl * m).sum() / m.sum(), rel=1e-4)
    assert float(got["vpd/kl_teacher_student"]) > 0
    chex.assert_tree_all_finite(got)
