"""The trainer: every algorithm x PIPO runs, the PI step's timing and sign, the jitted scan
loop against the host loop, and exact resume from a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import bnpo
from pipo_jax.rl import controller, learn, loop
from pipo_jax.rl import response_logprobs as logprobs
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.spec import ConfigError
from pipo_jax.run.placement import Placement
from tests.parallel import scenario
from tests.parallel.equivalence import assert_run_matches
from tests.rl.micro_trainer import fresh_state, host_iterations, micro
from tests.typed import spec_of, train_config

ALGOS = ("ppo", "grpo", "gspo", "dapo", "sdpo", "vpd")


# Every algorithm with PIPO (its base step, the PI step with its attribution, its extras) in
# bf16 compute over float32 master weights, the paper presets' precision; PIPO off once.
# Switching PIPO off removes the PI step for every algorithm alike, the compute dtype only
# casts (float32 compute is the default of every other trainer test), and each compile of
# the micro trainer costs tens of seconds.
# The fast tier keeps GRPO; every algorithm's loss is checked against its reference in tests/losses.
@pytest.mark.parametrize("algo, pipo_on, dtype",
                         [pytest.param(a, True, "bfloat16", id=f"{a}-pipo-bf16",
                                       marks=() if a == "grpo" else pytest.mark.slow) for a in ALGOS]
                         + [pytest.param("grpo", False, "float32", id="grpo-base", marks=pytest.mark.slow)])
def test_every_variant_runs_three_iterations(algo, pipo_on, dtype):
    # Seed 1: the random micro policy earns graded rewards with variance in every iteration (at
    # seed 0 every reward is 0, so no policy gradient and c = 0), so every step has signal.
    c = micro(algo, pipo_on, **{"model.dtype": dtype, "seed": 1})
    spec, state = fresh_state(c)
    before = jax.tree.map(np.asarray, state.params)
    state, m = host_iterations(spec, state, 3)
    assert int(state.step) == 3
    assert np.all(m["reward_std"][:2] > 0)
    for key, value in m.items():  # the window's moments are NaN until it is full
        assert np.all(np.isfinite(value)) or key in ("mu_his", "sigma_his"), key
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - np.asarray(b)))), before, state.params))
    assert max(changed) > 0
    # float32 masters and AdamW moments (with bf16 compute too); the frozen reference in the compute dtype
    trained = (state.params, state.opt_state, state.critic, state.teacher_params, state.teacher_opt_state)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trained) if jnp.issubdtype(x.dtype, jnp.floating))
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(state.ref_params))
    if pipo_on:
        # K = 2: the window is full from the third iteration on, and the PI step runs there (c != 0:
        # mu_2 differs from the mean of mu_0 and mu_1).
        assert list(m["pi_step_applied"][:2]) == [0.0, 0.0]
        assert m["c"][2] != 0 and m["pi_step_applied"][2] == 1.0
        np.testing.assert_array_equal(np.asarray(state.pipo.count), 2)
    if algo == "ppo":
        assert np.all(np.isfinite(m["critic/vf_loss"]))
    if algo == "dapo":
        assert np.all(m["dapo_groups_kept"] == c.rollout.prompts_per_batch)
    if algo == "vpd":  # F = 5: the E-step runs at iteration 0 only
        np.testing.assert_array_equal(m["vpd/e_step_applied"], [1.0, 0.0, 0.0])
        assert np.all(np.isfinite(m["vpd/kl_teacher_student"])) and np.all(m["vpd/teacher_entropy"] > 0)


def test_dr_grpo_runs_a_micro_iteration():
    """`algorithm=dr_grpo` (configs/dr_grpo.py: r - group mean, the constant-length token sum) through one
    trainer iteration (host loop): a step with signal, finite metrics, the params moved."""
    c = micro("dr_grpo", False, seed=1)
    spec, state = fresh_state(c)
    assert (spec.algorithm.name, spec.loss.agg_mode) == ("dr_grpo", "seq-mean-token-sum-norm")
    before = jax.tree.map(np.asarray, state.params)
    state, m = host_iterations(spec, state, 1)
    assert int(state.step) == 1 and m["reward_std"][0] > 0
    assert all(np.all(np.isfinite(v)) for k, v in m.items() if k not in ("mu_his", "sigma_his"))
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before, state.params))
    assert max(changed) > 0


COV = {"loss.kl_cov.ratio": 0.2, "loss.clip_cov.ratio": 0.2, "loss.clip_cov.low": -10.0}  # tokens are selected
OVERRIDES = {"kl_cov": COV, "clip_cov": COV, "riskpo": {"advantage.riskpo.bundle_size": 2}}  # RiskPO: bundles of 2


@pytest.mark.parametrize("algo", ["rloo", "reinforce_pp", "kl_cov", "clip_cov", "drpo", "bapo", "disco", "bnpo",
                                  "copo", "riskpo", "gdpo", "adora"])
def test_rloo_and_reinforce_pp_run_with_pipo(algo):
    """configs/rloo.py, configs/reinforce_pp.py, configs/kl_cov.py and configs/clip_cov.py with
    `pipo.enabled=true` through three trainer iterations (host loop) (K = 2): the base step trains every
    iteration, the window and the stored batch advance, the PI step runs at the third; the stored
    attribution is the algorithm's: the group attribution of RLOO, KL-Cov and Clip-Cov (one value per
    response, sum |a| = G over a group with signal), REINFORCE++'s whitened token advantages (mean 0
    over the batch's valid tokens, varying along a response). KL-Cov / Clip-Cov (larger ratios and,
    for Clip-Cov, a wider covariance window than the paper's, so that the micro batch has selected
    tokens): the base step's loss selects tokens every iteration. DRPO, BAPO, DisCO and BNPO: the group
    attribution. BNPO: its pool of success rates (`TrainState.estimator_state`) holds the three batches'
    rates at weights .81, .9, 1 (their sum is P mu_t, the rewards being on [0, 1]), and the logged Beta
    parameters are the pool's. COPO: its blended advantage, one value per response, the global advantage alone
    on the zero-reward responses (a group earning nothing still has a signal). RiskPO: its advantages, one value
    per response, shared by the same response index of a bundle's prompts, never positive (the natural
    baseline). GDPO: the group attribution; the task's reward components, logged, sum to its reward. ADORA: the
    group attribution times its prompt's weight, sum |a| = G over an advantageous prompt's group, G lambda over
    a disadvantageous one's (the micro policy's rewards stay below the threshold .5: no prompt has a correct
    response, so every group with a signal is disadvantageous)."""
    # seed 3: rewards vary within some group in each of the three iterations (at seed 1 the third batch of most
    # of these methods has none), so the stored batch has an attribution
    c = micro(algo, True, **{"seed": 3, **OVERRIDES.get(algo, {})})
    spec, state = fresh_state(c)
    assert spec.algorithm.name == algo and spec.pipo.enabled
    before = jax.tree.map(np.asarray, state.params)
    state, m = host_iterations(spec, state, 3)
    assert int(state.step) == 3 and np.all(m["reward_std"][:2] > 0)
    assert all(np.all(np.isfinite(v)) for k, v in m.items() if k not in ("mu_his", "sigma_his"))
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before, state.params))
    assert max(changed) > 0
    assert list(m["pi_step_applied"]) == [0.0, 0.0, 1.0] and m["c"][2] != 0
    assert np.isfinite(m["pi/loss"][2]) and m["pi/grad_norm"][2] > 0
    assert int(state.pipo.count) == 2 and bool(state.pipo.has_prev)
    np.testing.assert_allclose(np.asarray(state.pipo.mu_window_k), m["mu_t"][1:], rtol=1e-6)
    attr, mask = np.asarray(state.pipo.prev.attr_br), np.asarray(state.pipo.prev.mask_br)
    valid = mask > 0
    assert np.all(attr[~valid] == 0) and np.any(attr[valid] != 0)
    if algo in ("kl_cov", "clip_cov"):
        assert np.all(m["train/cov_frac"] > 0)
    if algo == "bapo":  # the bounds Algorithm 1 chose each step lie in [a-, b-] x [a+, b+]
        low, high = m["train/bapo_clip_low"], m["train/bapo_clip_high"]
        assert np.all((low > 0.6 - 1e-5) & (low < 0.9 + 1e-5) & (high > 1.2 - 1e-5) & (high < 3.0 + 1e-5))
        assert np.all((m["train/bapo_pos_share"] >= 0) & (m["train/bapo_pos_share"] <= 1 + 1e-6))
    if algo == "bnpo":
        pool, p = state.estimator_state, c.rollout.prompts_per_batch
        np.testing.assert_allclose([pool.weight, pool.weight_sq], [p * (1 + 0.9 + 0.81), p * (1 + 0.81 + 0.9 ** 4)],
                                   rtol=1e-6)
        np.testing.assert_allclose(pool.rate_sum, p * (m["mu_t"][2] + 0.9 * m["mu_t"][1] + 0.81 * m["mu_t"][0]),
                                   rtol=1e-5)
        params = jax.device_get(bnpo.beta_parameters(pool))
        np.testing.assert_allclose([m["advantage/bnpo_alpha"][2], m["advantage/bnpo_beta"][2]],
                                   [params["alpha"], params["beta"]], rtol=1e-6)
        assert np.all(m["advantage/bnpo_alpha"] >= 1) and np.all(m["advantage/bnpo_beta"] > 1)
    if algo == "gdpo":
        np.testing.assert_allclose(m["reward_component/answer"] + m["reward_component/stop"], m["reward_mean"],
                                   rtol=1e-5)
    if algo == "copo":  # one value per response; a group of equal nonzero values: a prompt whose group earned 0
        assert np.all((m["train/copo_local_weight"] >= 0) & (m["train/copo_local_weight"] <= 1))
        row = attr[:, 0]
        assert np.all(np.where(valid, attr, row[:, None]) == row[:, None])
        groups = row.reshape(-1, spec.rollout.group_size)
        assert np.any((np.ptp(groups, axis=1) == 0) & (groups[:, 0] != 0))
    elif algo == "riskpo":  # uniform credit: papers g of the bundles {0, 1} and {2, 3}; the natural baseline: A <= 0
        row = attr[:, 0]
        assert np.all(np.where(valid, attr, row[:, None]) == row[:, None])
        bundles = row.reshape(-1, 2, spec.rollout.group_size)
        np.testing.assert_array_equal(bundles[:, 0], bundles[:, 1])
        assert np.all(row <= 0) and np.any(row < 0)
    elif algo == "adora":
        row = attr[:, 0]
        assert np.all(np.where(valid, attr, row[:, None]) == row[:, None])
        sums = np.abs(row).reshape(-1, spec.rollout.group_size).sum(axis=1)
        g, lam = spec.rollout.group_size, spec.advantage.adora.tds_weight
        assert np.all(np.isclose(sums, 0) | np.isclose(sums, g * lam, rtol=1e-5)) and np.any(sums > 0)
    elif algo in ("rloo", "kl_cov", "clip_cov", "drpo", "bapo", "disco", "bnpo", "gdpo"):
        row = attr[:, 0]
        assert np.all(np.where(valid, attr, row[:, None]) == row[:, None])
        sums = np.abs(row).reshape(-1, spec.rollout.group_size).sum(axis=1)
        np.testing.assert_allclose(sums[sums > 0], spec.rollout.group_size, rtol=1e-5)
    else:  # whitened: std sqrt(v / (v + 1e-8)) of the returns' variance v (< 1 when only the KL varies)
        assert abs(attr[valid].mean()) < 1e-4 and 0 < attr[valid].std(ddof=1) <= 1 + 1e-4
        full = valid.all(axis=1)  # the KL to go makes the tokens of a response differ
        assert np.any(np.ptp(attr[full], axis=1) > 1e-3)


# Compiled once for every case below (same spec and shapes; count and mu_t are array inputs).
_pi_step = jax.jit(learn.pi_step, static_argnums=0)
_response_logprobs = jax.jit(logprobs.response_logprobs, static_argnums=(0, 4))


def _pi_case(c_sign: float, count: int = 4, mu_t: float | None = None):
    """A stored batch where sequence 0's tokens have attribution +1 and sequence 1's -1.

    One optimizer step (a single mini-batch, one epoch) at a small learning rate, so the
    change of each sequence's log-prob is first order in the update.
    """
    c = micro("grpo", True, **{"pipo.window": 4, "pipo.lr": 1e-4, "train.mini_batch_prompts": 4,
                               "train.shuffle": False})
    spec, state = fresh_state(c)
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(3, 20, (b, L)), jnp.int32)
    mask_l = jnp.ones((b, L), jnp.int32)
    mask_r = jnp.ones((b, r), jnp.float32)
    logp_old, _ = _response_logprobs(spec.model, state.params, tokens, mask_l, spec.prompt_len)
    attr = jnp.zeros((b, r)).at[0].set(1.0).at[1].set(-1.0)
    stored = TrainBatch(tokens_bl=tokens, mask_bl=mask_l, mask_br=mask_r, logp_old_br=logp_old,
                        logp_ref_br=logp_old, attr_br=attr)
    window = jnp.array([0.2, 0.4, 0.2, 0.4])
    ps = controller.PipoState(mu_window_k=window, count=jnp.int32(count), has_prev=jnp.bool_(True), prev=stored)
    mu = 0.3 + c_sign * 0.2 if mu_t is None else mu_t
    params, _, m = _pi_step(spec, state.params, state.opt_state, ps, jnp.float32(mu), jax.random.PRNGKey(0),
                           hyper=state.hyper)
    logp_new, _ = _response_logprobs(spec.model, params, tokens, mask_l, spec.prompt_len)
    delta = np.asarray(jnp.sum(logp_new - logp_old, axis=1))
    return m, delta, state.params, params


def test_pi_step_moves_params_in_the_direction_of_c():
    m, delta, _, _ = _pi_case(+1.0)
    # window mean 0.3, std (ddof 1) 0.11547: mu_t = 0.5 -> xi = 1.732 = c
    np.testing.assert_allclose(m["xi"], 0.2 / np.std([0.2, 0.4, 0.2, 0.4], ddof=1), rtol=1e-5)
    assert m["pi_step_applied"] == 1.0 and m["c"] > 0
    # Adam's first step is -lr * sign(g) with g = -(rhat_0 grad logp_0 + rhat_1 grad logp_1), so
    # (delta_0 - delta_1) = lr * c * |grad logp_0 - grad logp_1|_1 to first order: its sign is c's.
    assert delta[0] > 0 and delta[0] - delta[1] > 0  # positive rhat reinforced over negative
    m, delta, _, _ = _pi_case(-1.0)
    np.testing.assert_allclose(m["c"], 0.1 * m["xi"], rtol=1e-6)  # rectifier lam = 0.1
    assert m["pi_step_applied"] == 1.0 and m["c"] < 0
    assert delta[1] - delta[0] > 0  # the improvement reversed: the previous update is undone


@pytest.mark.parametrize("case", ["warmup", "c_zero"])
def test_pi_step_is_skipped_during_warmup_and_at_c_zero(case):
    m, delta, before, after = _pi_case(+1.0, count=3) if case == "warmup" else _pi_case(0.0, mu_t=0.3)
    assert m["pi_step_applied"] == 0.0 and m["c"] == 0.0
    jax.tree.map(np.testing.assert_array_equal, before, after)
    np.testing.assert_array_equal(delta, 0.0)


@pytest.mark.slow  # two compiles of the trainer (one jit; generate and learn jitted apart)
@pytest.mark.parametrize("algo, chunk", [("grpo", 1), ("dapo", 3)])
def test_jitted_scan_loop_equals_host_loop(algo, chunk):
    """Three iterations of the scanned loop in chunks of `chunk` iterations against the host loop. GRPO: chunks
    of one, as the micro trainer runs them (`log.every=1`), so its program is the trainer tests' (a compilation
    cache hit); DAPO: one chunk of three, the state (and the dynamic sampling) carried through the scan."""
    c = micro(algo, True, seed=1)  # rewards with variance: the updates move the params (at seed 0 all rewards are 0)
    spec, state = fresh_state(c)
    initial = scenario.flatten(jax.device_get(state.params))
    scanned, chunks = jax.tree.map(jnp.copy, state), []
    for _ in range(3 // chunk):
        scanned, m = loop.scan_chunk(spec, scanned, chunk)
        chunks.append(jax.device_get(m))
    m_scan = {k: np.concatenate([m[k] for m in chunks]) for k in chunks[0]}
    host, m_host = host_iterations(spec, state, 3)  # a Python (host) reward function
    # The same computation in other jit boundaries, so XLA may fuse and order float32 sums
    # differently: sampled tokens, counters and PI-step flags exactly, metrics to float32
    # rounding, parameters within one AdamW step of noise (tests/parallel/equivalence.py says why).
    assert_run_matches(scenario.run_summary(host, m_host), scenario.run_summary(jax.device_get(scanned), m_scan),
                       initial, max(spec.train.lr, spec.pipo.lr))


@pytest.mark.slow  # four training runs of the main job
@pytest.mark.parametrize("algo", ["grpo", "bnpo"])  # BNPO: its pool of success rates is resumed too
def test_resume_is_exact(tmp_path, algo):
    c = micro(algo, True, iterations=4, **{"checkpoint.every": 2, "checkpoint.export_hf": False})
    full = train_config(c, str(tmp_path / "full"))
    c_stop = micro(algo, True, iterations=2, **{"checkpoint.every": 2, "checkpoint.export_hf": False})
    train_config(c_stop, str(tmp_path / "resumed"))
    resumed = train_config(c, str(tmp_path / "resumed"))
    assert resumed["resumed_from"] == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(full["state"]), jax.device_get(resumed["state"]))
    rows_full = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    rows_resumed = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    # Timings are not results, and a run also evaluates at its own last iteration (step 2 of the stopped run).
    wall_clock = ("tokens_per_s", "iteration_time_s", "warmup_time_s", "heldout_accuracy")
    strip = lambda rows: [{k: v for k, v in __import__("json").loads(r).items()  # noqa: E731
                           if k not in wall_clock} for r in rows]
    assert strip(rows_full) == strip(rows_resumed)
    # Running a finished workdir again resumes at its end: nothing to train, no second save.
    again = train_config(c, str(tmp_path / "resumed"))
    assert again["resumed_from"] == 4 and again["final_accuracy"] == resumed["final_accuracy"]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(full["state"]), jax.device_get(again["state"]))
    assert strip((tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()) == strip(rows_full)
    c.checkpoint.resume = False  # a fresh run never overwrites another run's checkpoints
    with pytest.raises(ConfigError, match=r"config.checkpoint.resume: false, but .*holds checkpoints \[0, 2, 4\]"):
        train_config(c, str(tmp_path / "resumed"))


def test_the_host_loop_logs_the_rewards_counts_of_its_iteration():
    """A host reward's counts (`take_counts`, e.g. a math batch's `reward/unscored_count`) become the
    iteration's metrics; what was counted before the iteration (evaluation) is not included."""
    c = micro("grpo", False)
    spec, state = fresh_state(c)

    class CountingReward:
        def __init__(self):
            self.pending = {"reward/unscored_count": 5}  # counted by an evaluation before the iteration

        def __call__(self, r):
            self.pending["reward/unscored_count"] += 3
            return np.asarray(loop.rollout_lib.task_rewards(spec, r))

        def score_rollout(self, r):
            return loop.RewardFunction(self).score_rollout(r)

        def take_counts(self):
            out, self.pending = self.pending, {"reward/unscored_count": 0}
            return out

    assert isinstance(CountingReward(), loop.HostReward)
    _, m = loop.host_iteration(spec, state, CountingReward())
    assert m["reward/unscored_count"] == 3


def test_dapo_raises_when_no_informative_group_is_found():
    # Exact rewards on a random model: every group is all-fail, so nothing is ever kept.
    c = micro("dapo", False, **{"task.arithmetic.reward_mode": "exact", "dapo.max_num_gen_batches": 2})
    spec, state = fresh_state(c)
    with pytest.raises(loop.DynamicSamplingExhausted, match=r"kept only 0 of 4 .*max_num_gen_batches=2"):
        loop.host_iteration(spec, state, loop.RewardFunction(lambda r: np.zeros(r.size, np.float32)))


@pytest.mark.slow  # compiles the scan loop of its own DAPO variant
def test_dapo_exhaustion_in_the_scan_loop_is_an_error():
    c = micro("dapo", False, **{"task.arithmetic.reward_mode": "exact", "dapo.max_num_gen_batches": 2})
    spec, state = fresh_state(c)
    with pytest.raises(loop.DynamicSamplingExhausted, match=r"kept only 0 of 4 .*max_num_gen_batches=2"):
        Placement().run(spec, state, 1, True, None)


def test_sdpo_teacher_context_shows_a_successful_sibling_or_feedback():
    from pipo_jax.data import char_vocab as cv
    from pipo_jax.rl.experience import Rollout
    from pipo_jax.tasks import arithmetic

    c = micro("sdpo", False, **{"rollout.group_size": 2, "rollout.prompts_per_batch": 1,
                                "train.mini_batch_prompts": 1, "task.arithmetic.answer_format": "plain"})
    spec = spec_of(c)
    problems = arithmetic.make_problems(spec.task, jnp.array([12, 12]), jnp.array([0, 0]), jnp.array([30, 30]))
    responses = ["42<eos>", "41<eos>"]
    resp = jnp.array([cv.encode(r) + [cv.PAD_ID] * (spec.rollout.max_new_tokens - len(cv.encode(r))) for r in responses])
    resp_mask = (jnp.arange(spec.rollout.max_new_tokens)[None] < jnp.array([[3], [3]])).astype(jnp.int32)
    rollout = Rollout(problems=problems, tokens_bl=jnp.concatenate([problems.prompt_tokens_bp, resp], 1),
                      mask_bl=jnp.concatenate([problems.prompt_mask_bp, resp_mask], 1),
                      sample_logp_br=jnp.zeros(resp.shape), rewards_b=jnp.array([1.0, 0.0]))
    tokens, mask, sd_mask = learn.teacher_contexts(spec, rollout, rollout.rewards_b)
    text = [cv.decode(np.asarray(t)[np.asarray(m) == 1]) for t, m in zip(tokens, mask)]
    # Row 1 failed and its sibling succeeded: shown as the solution. Row 0 has no other
    # successful sibling: environment feedback instead.
    assert text[1] == "<solution>42<eos><solve><bos>12+30=41<eos>"
    assert text[0] == "<feedback><correct><solve><bos>12+30=42<eos>"
    np.testing.assert_array_equal(sd_mask, [1.0, 1.0])
    # The response sits at the end of the teacher row, where the student's is in its row.
    np.testing.assert_array_equal(tokens[:, -spec.rollout.max_new_tokens:], resp)


@pytest.mark.slow  # one compile of the update per hybrid
@pytest.mark.parametrize("mode", ["joint", "reshape"])
def test_vpd_hybrids_run(mode):
    from configs import vpd as vpd_configs

    c = vpd_configs.hybrid("micro", mode)
    c.pipo.enabled = True
    spec, state = fresh_state(c)
    assert spec.vpd.hybrid == mode and spec.loss.policy == "token_clip" and spec.pipo.attribution == "group"
    state, m = host_iterations(spec, state, 2)
    assert np.all(np.isfinite(m["train/loss"])) and list(m["vpd/e_step_applied"]) == [1.0, 0.0]


@pytest.mark.slow  # two compiles of the update
def test_vpd_without_e_step_is_sdpo():
    vpd_c = micro("vpd", True, **{"vpd.e_step": False})
    sdpo_c = micro("sdpo", True, **{"loss.policy": "sdpo_token"})
    (vpd_spec, vpd_state), (sdpo_spec, sdpo_state) = fresh_state(vpd_c), fresh_state(sdpo_c)
    vpd_state, _ = host_iterations(vpd_spec, vpd_state, 2)
    sdpo_state, _ = host_iterations(sdpo_spec, sdpo_state, 2)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(vpd_state.params), jax.device_get(sdpo_state.params))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(vpd_state.teacher_params),
                 jax.device_get(sdpo_state.teacher_params))
