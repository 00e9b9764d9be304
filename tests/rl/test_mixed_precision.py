"""Mixed precision: float32 master weights and AdamW state, bf16 compute (`model.dtype`), with PIPO.

The same three learn steps (PI step + base step each) on the same fixed rollouts, once with
float32 compute and once with bf16 compute, from the same float32 initial state.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.parallel import shardings
from pipo_jax.rl import controller, learn, rollout
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.state import init_train_state
from tests.conftest import override
from tests.rl.micro_trainer import collected, learned
from tests import typed

STEPS = 3
SEED = 1


def spec_of(algo: str, dtype: str, **overrides):
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    c.pipo.enabled = True
    c.seed = SEED
    c.model.dtype = dtype
    return typed.spec_of(override(c, overrides))


def primed_state(spec):
    """A fresh float32 state whose PIPO window is full (means 0.2, 0.4) with a stored batch,
    so the PI step runs from the first learn step."""
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(SEED)), SEED)
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    rng = np.random.RandomState(SEED)
    tokens = rng.randint(3, spec.model.vocab_size, (b, L)).astype(np.int32)
    mask_r = np.ones((b, r), np.float32)
    attn = np.ones((b, L), np.int32)
    attr = np.where(np.arange(b)[:, None] % 2 == 0, 1.0, -1.0) * mask_r
    stored = TrainBatch(tokens_bl=jnp.asarray(tokens), mask_bl=jnp.asarray(attn),
                        mask_br=jnp.asarray(mask_r), logp_old_br=jnp.asarray(-3.5 * mask_r),
                        logp_ref_br=jnp.asarray(-3.5 * mask_r), attr_br=jnp.asarray(attr, jnp.float32))
    window = jnp.zeros((spec.pipo.window,), jnp.float32).at[-2:].set(jnp.array([0.2, 0.4]))
    return state.replace(pipo=controller.PipoState(mu_window_k=window, count=jnp.int32(2), has_prev=jnp.bool_(True),
                                             prev=stored))


def fixed_rollouts(spec, state):
    """STEPS scored rollouts of the float32 policy (the same inputs for both precisions)."""
    return [collected(spec, state.params, jax.random.PRNGKey(10 + i)) for i in range(STEPS)]


def run_learn(spec, state, rollouts):
    """The host loop's learn step (the trainer's program) on each rollout, from a copy of `state`."""
    state = jax.tree.map(jnp.copy, state)  # the host loop's learn donates its input
    metrics = []
    for i, r in enumerate(rollouts):
        state, m = learned(spec, state, r, jax.random.PRNGKey(100 + i))
        metrics.append(jax.device_get(m))
    return state, metrics


@pytest.mark.slow  # ~2 min compile-bound on a shared 2-core CPU
def test_bf16_compute_with_pipo_is_finite_and_close_to_float32():
    spec32, spec16 = spec_of("grpo", "float32"), spec_of("grpo", "bfloat16")
    # placed as the trainer places its state, so the learn steps are the trainer tests' programs
    state0 = shardings.on_default_device(primed_state(spec32))
    rollouts = fixed_rollouts(spec32, state0)
    s32, m32 = run_learn(spec32, state0, rollouts)
    s16, m16 = run_learn(spec16, shardings.on_default_device(primed_state(spec16)), rollouts)

    # fp32 masters and AdamW state; the frozen reference in the compute dtype
    floats = [x for x in jax.tree.leaves((s16.params, s16.opt_state)) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert len(floats) > 3 * len(jax.tree.leaves(s16.params))  # params, Adam's mu and nu, the learning rate
    assert all(x.dtype == jnp.float32 for x in floats)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(s16.ref_params))

    for a, b in zip(m32, m16):
        assert a["pi_step_applied"] == b["pi_step_applied"] == 1.0  # the PI step ran in every step
        for k, v in b.items():
            assert np.all(np.isfinite(v)) or k in ("mu_his", "sigma_his"), k
        # bf16 keeps 8 significant bits (relative rounding 2**-9 = 0.2% per op); through two
        # layers the behaviour policy's entropy (~3.4 nats) moved by < 1e-4 (measured), 1e-3 bounds it.
        assert abs(a["entropy"] - b["entropy"]) < 1e-3
        assert b["pi/grad_norm"] == pytest.approx(a["pi/grad_norm"], rel=0.05)  # measured <= 1.3%

    def update(s):
        return [np.asarray(x, np.float64) - np.asarray(y, np.float64)
                for x, y in zip(jax.tree.leaves(s.params), jax.tree.leaves(state0.params))]

    d32, d16 = update(s32), update(s16)
    norm = lambda xs: np.sqrt(sum(np.sum(x ** 2) for x in xs))  # noqa: E731
    rel = norm([a - b for a, b in zip(d16, d32)]) / norm(d32)
    # AdamW normalises each element, so elements whose gradient is within bf16 noise of zero
    # move by up to 2 lr either way; measured 3.7% of the update's norm (cosine 0.9993).
    # 0.15 bounds that; bf16 master weights would drop most of the update instead.
    assert 1e-4 < rel < 0.15  # > 1e-4: the compute really ran in bf16


ALGOS = ("ppo", "grpo", "gspo", "dapo", "sdpo", "vpd")


@pytest.mark.parametrize("algo", ALGOS)
def test_bf16_compute_with_pipo_traces_for_every_algorithm(algo):
    """The learn step (PI step under `lax.cond`, base step, critic / teacher) traces with bf16
    compute and float32 masters, and keeps every trained tree and AdamW moment in float32."""
    spec = spec_of(algo, "bfloat16")
    state = jax.eval_shape(lambda: primed_state(spec))
    gen = spec.generation
    ro = jax.eval_shape(lambda p: rollout.generate(gen, p, rollout.sample_problems(gen, jax.random.PRNGKey(0),
                                                                                   spec.rollout.prompts_per_batch),
                                                   jax.random.PRNGKey(1)), state.params)
    new, metrics = jax.eval_shape(lambda s, r: learn.learn(spec, s, r, jax.random.PRNGKey(2)), state, ro)
    assert "pi_step_applied" in metrics
    trained = (new.params, new.opt_state, new.critic, new.teacher_params, new.teacher_opt_state)
    floats = [x.dtype for x in jax.tree.leaves(trained) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(d == jnp.float32 for d in floats)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(new.ref_params))


# Every algorithm's full iteration (generate, PI step, base step, critic / teacher) runs in bf16
# compute with PIPO in tests/rl/test_trainer.py::test_every_variant_runs_three_iterations.
