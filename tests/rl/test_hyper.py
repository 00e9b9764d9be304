"""Hyperparameters as data (`rl/hyper.py`): configs that differ only in a `HYPER_KEYS` value have equal specs
and one program, whose members of a vmapped stack each train with their own values; a restore takes them
from the run's config."""

import dataclasses
import importlib
from typing import Any

import flax
import jax
import numpy as np
import pytest

from configs import vpd
from experiments import vmapped
from pipo_jax.models import qwen3
from pipo_jax.rl import hyper, loop
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import TrainState, init_train_state
from pipo_jax.run import sharded_steps
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.placement import Placement
from tests.conftest import override
from tests.typed import spec_of

# A value for every hyperparameter key other than configs/grpo.py:micro's (with loss.entropy_coef 0.001 there).
CHANGED = {"train.lr": 3e-4, "critic.lr": 2e-5, "pipo.lr": 2e-4, "vpd.lr": 5e-5, "pipo.lam": 0.5, "loss.clip_low": 0.1,
           "loss.clip_high": 0.3, "pipo.pi_clip_low": 0.15, "pipo.pi_clip_high": 0.25, "loss.clip_ratio_c": 2.0,
           "loss.kl_coef": 0.01, "loss.entropy_coef": 0.002}
FIELD = {"train.lr": "lr", "critic.lr": "critic_lr", "pipo.lr": "pi_lr", "vpd.lr": "vpd_lr", "pipo.lam": "lam",
         "loss.clip_low": "ratio_low", "loss.clip_high": "ratio_high", "pipo.pi_clip_low": "pi_ratio_low",
         "pipo.pi_clip_high": "pi_ratio_high", "loss.clip_ratio_c": "clip_ratio_c", "loss.kl_coef": "kl_coef",
         "loss.entropy_coef": "entropy_coef"}


def config(algo: str = "grpo", **overrides):
    """`configs/<algo>.py:micro` with PIPO and `overrides` (`vpd_joint`: VPD's joint hybrid)."""
    c = vpd.hybrid("micro", "joint") if algo == "vpd_joint" else importlib.import_module(
        f"configs.{algo}").get_config("micro")
    c.pipo.enabled = True
    return override(c, overrides)


def grpo_with_entropy(**overrides):
    return config("grpo", **{"loss.entropy_coef": 0.001, **overrides})


def test_configs_differing_in_one_hyperparameter_have_equal_specs():
    assert set(CHANGED) == set(hyper.HYPER_KEYS) == set(FIELD)
    for key, value in CHANGED.items():
        make = (lambda **o: config("vpd", **o)) if key == "vpd.lr" else grpo_with_entropy
        base = spec_of(make())
        spec = spec_of(make(**{key: value}))
        assert spec == base and hash(spec) == hash(base), key
        section, name = key.split(".")
        assert getattr(getattr(spec, section), name) == value  # the spec still holds the config's value
        h0, h = hyper.hyperparameters_of(base), hyper.hyperparameters_of(spec)
        # the changed key's field alone differs (and the PI step's clip, unset: the base loss's), float32; a
        # clip's eps as its bound 1 - eps_low / 1 + eps_high
        fields = {FIELD[key]} | ({"pi_" + FIELD[key]} if key in ("loss.clip_low", "loss.clip_high") else set())
        bound = {"clip_low": 1 - value, "clip_high": 1 + value}.get(name.removeprefix("pi_"), value)
        for field in FIELD.values():
            want = np.float32(bound) if field in fields else np.asarray(getattr(h0, field))
            assert np.asarray(getattr(h, field)).dtype == np.float32
            assert np.asarray(getattr(h, field)) == want, (key, field)
    h0 = hyper.hyperparameters_of(spec_of(grpo_with_entropy()))
    # unset, the PI step's clip is the base loss's; no VPD teacher: its learning rate 0
    assert h0.pi_ratio_low == np.float32(0.8) and h0.pi_ratio_high == np.float32(1.2)
    assert float(h0.vpd_lr) == 0.0


@pytest.mark.parametrize("key", hyper.SWITCHED_BY_ZERO)
def test_switching_a_term_off_is_structure(key):
    """0 switches the dual clip, the KL term or the entropy bonus off: a different program, a different spec."""
    assert spec_of(grpo_with_entropy(**{key: 0.0})) != spec_of(grpo_with_entropy())


def test_other_keys_stay_static_and_values_are_still_checked():
    base = spec_of(config())
    for key, value in (("pipo.window", 3), ("rollout.temperature", 0.7), ("rollout.group_size", 2)):
        assert spec_of(config(**{key: value})) != base, key
    with pytest.raises(ConfigError, match=r"^config\.loss\.clip_low: 1\.5 must be in \[0, 1\]$"):
        spec_of(config(**{"loss.clip_low": 1.5}))
    with pytest.raises(ConfigError, match=r"^config\.pipo\.lam: 2\.0 must be in \[0, 1\]$"):
        spec_of(config(**{"pipo.lam": 2.0}))


def _every_value_changed(algo: str, **overrides):
    """(config, the same config with every hyperparameter changed that is not 0: a zero is structure)."""
    c = config(algo, **overrides)
    changed = {}
    for key, value in CHANGED.items():
        section, name = key.split(".")
        if not (key in hyper.SWITCHED_BY_ZERO and c[section][name] == 0):
            changed[key] = value
    return c, config(algo, **{**overrides, **changed})


def _iteration_program(spec, abstract_state) -> str:
    return jax.jit(lambda s: loop.iteration(spec, s)).lower(abstract_state).as_text()


@pytest.mark.parametrize("algo,overrides", [
    ("grpo", {"loss.entropy_coef": 0.001}), ("grpo", {"pipo.pi_optimizer": "separate", "pipo.compat": True}),
    ("ppo", {}), ("dapo", {}), ("gspo", {}), ("grpo", {"loss.policy": "cispo", "loss.clip_ratio_c": 0.0}),
    ("copo", {}), ("clip_cov", {}), ("sdpo", {}), ("vpd_joint", {}), ("adora", {}),
], ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "-")
def test_no_hyperparameter_value_is_read_from_the_spec(algo, overrides):
    """One whole iteration (sample, reward, PIPO's PI step, the base and critic steps) lowered for two specs
    whose hyperparameters all differ is the same program, constant for constant: nothing reads a value from
    the spec. Every policy loss that takes a clip, the critic, the PI step's two optimizer forms."""
    a, b = (spec_of(c) for c in _every_value_changed(algo, **overrides))
    assert a == b and a.train.lr != b.train.lr
    state = sharded_steps.abstract_train_state(a)
    assert _iteration_program(a, state) == _iteration_program(b, state)


def test_the_lowered_program_shows_a_value_read_from_the_spec():
    """The check above can fail: with the hyperparameters taken from each spec as constants, the two
    lowered iterations differ."""
    a, b = (spec_of(c) for c in _every_value_changed("grpo"))
    state = sharded_steps.abstract_train_state(a)

    def baked(spec):
        return jax.jit(lambda s: loop.iteration(spec, s.replace(hyper=hyper.hyperparameters_of(spec)))).lower(
            state).as_text()

    assert baked(a) != baked(b)


MEMBERS = [{}, {"train.lr": 3e-4, "loss.kl_coef": 0.01},
           {"pipo.lam": 0.5, "pipo.lr": 2e-4, "loss.clip_low": 0.1, "loss.clip_high": 0.3,
            "loss.clip_ratio_c": 2.0}]


@pytest.mark.slow  # the iteration compiled twice, vmapped and alone
def test_a_vmapped_stack_of_hyperparameters_equals_separate_runs_on_one_program():
    """Three members from one base model and seed, differing in train.lr / kl_coef / lam / pipo.lr / clips /
    dual clip, advance as one vmapped program (`vmapped.vmapped_chunk`, the spec of the first); each equals
    its own run alone, which reuses one compiled program for all three (no retrace)."""
    configs = [config(**{"pipo.window": 2, **m}) for m in MEMBERS]
    specs = [spec_of(c) for c in configs]
    assert all(s == specs[0] for s in specs)
    params = jax.device_get(qwen3.init_params(specs[0].model, jax.random.PRNGKey(7)))  # host: never donated
    states = [init_train_state(s, jax.device_put(params), 3) for s in specs]
    n = 4
    together, m_together = vmapped.vmapped_chunk(specs[0], vmapped.stack(states), n)
    before = loop.scan_chunk._cache_size()
    alone = []
    for i, spec in enumerate(specs):
        alone.append(loop.scan_chunk(spec, init_train_state(spec, jax.device_put(params), 3), n))
        if i == 0:
            compiled = loop.scan_chunk._cache_size()
            assert compiled == before + 1
    assert loop.scan_chunk._cache_size() == compiled  # members 1 and 2: the program of member 0
    assert float(np.sum(m_together["pi_step_applied"])) > 0  # the PI step ran (its lr, lam and clip acted)
    steps = n * (specs[0].batch // specs[0].mini_batch) * 2  # base and PI optimizer steps
    atol = 2 * max(c.train.lr for c in configs) * steps  # as tests/test_compare.py: batched vs unbatched matmuls
    for i, (state_i, m_i) in enumerate(alone):
        np.testing.assert_array_equal(m_together["reward_mean"][i], m_i["reward_mean"])
        np.testing.assert_array_equal(m_together["pi_step_applied"][i], m_i["pi_step_applied"])
        np.testing.assert_array_equal(np.asarray(together.hyper.lr[i]), np.float32(configs[i].train.lr))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=0, atol=atol),
                     jax.device_get(together.params), jax.device_get(state_i.params))
    # the values acted: member 1 (3x the learning rate) moved further from the shared start than member 0, and
    # member 2 (lam, PI lr, clips) ended elsewhere
    leaves, start = jax.tree.leaves(jax.device_get(together.params)), jax.tree.leaves(params)
    moved = [sum(float(np.abs(a[i] - b).sum()) for a, b in zip(leaves, start)) for i in range(3)]
    assert moved[1] > 1.5 * moved[0], moved
    assert max(float(np.max(np.abs(a[2] - a[0]))) for a in leaves) > 1e-4


def test_a_restore_sets_the_hyperparameters_from_the_runs_config(tmp_path):
    """A checkpoint saved under one config restores (`Placement.restore`) with the hyperparameters of the
    config it resumes with, the rest as saved; one saved before `TrainState.hyper` existed, or with the former
    fields of `Hyperparameters` (the clip's eps, not its bounds), restores the same."""

    @flax.struct.dataclass
    class FormerHyperparameters:  # Hyperparameters' fields when they held the clip's eps
        lr: Any
        critic_lr: Any
        pi_lr: Any
        vpd_lr: Any
        lam: Any
        clip_low: Any
        clip_high: Any
        pi_clip_low: Any
        pi_clip_high: Any
        clip_ratio_c: Any
        kl_coef: Any
        entropy_coef: Any

    @flax.struct.dataclass
    class FormerTrainState:  # TrainState's fields before hyper
        step: Any
        params: Any
        opt_state: Any
        ref_params: Any
        critic: Any
        teacher_params: Any
        pipo: Any
        rng: Any
        teacher_opt_state: Any = None
        vpd_delta: Any = None
        pi_opt_state: Any = None
        estimator_state: Any = None

    assert [f.name for f in dataclasses.fields(TrainState)] == [
        f.name for f in dataclasses.fields(FormerTrainState)] + ["hyper"]
    spec = spec_of(config())
    resumed = spec_of(config(**{"train.lr": 3e-4, "pipo.lam": 0.5}))
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(1)), 1)
    state = state.replace(step=state.step + 4)
    h = state.hyper
    former_hyper = FormerHyperparameters(
        **{f.name: getattr(h, f.name, np.float32(0.2)) for f in dataclasses.fields(FormerHyperparameters)})
    for name, saved in (("current", state), ("former", FormerTrainState(
            **{f.name: getattr(state, f.name) for f in dataclasses.fields(FormerTrainState)})),
            ("former hyper", state.replace(hyper=former_hyper))):
        ckpt = Checkpointer(str(tmp_path / name), keep=1)
        ckpt.save(4, saved)
        ckpt.wait()
        restored = Placement().restore(ckpt, resumed)
        ckpt.close()
        want = state.replace(hyper=hyper.hyperparameters_of(resumed))
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(want))
        assert float(restored.hyper.lr) == np.float32(3e-4) and float(restored.hyper.lam) == np.float32(0.5), name


EPS = (0.18, 0.15, 0.1, 0.3, 1e-3, 0.2, 0.28, 3e-4, 4e-4)


def test_the_clip_bounds_are_the_exact_bounds_rounded_once():
    """Every bound the program reads is 1 - eps_low / 1 + eps_high computed in float64 and rounded once to
    float32, the constant a Python float folded to, also where float32 arithmetic on the float32 eps is one
    ulp off (0.18, 0.15, 0.1, 0.3, 1e-3: the check can fail)."""
    f32 = np.float32
    assert {v for v in EPS if f32(1) + f32(v) != f32(1 + v) or f32(1) - f32(v) != f32(1 - v)} >= {0.18}
    for v in EPS:
        for h in (hyper.hyperparameters_of(spec_of(config(**{"loss.clip_low": v, "loss.clip_high": v}))),
                  hyper.hyperparameters_of(spec_of(config(**{"pipo.pi_clip_low": v, "pipo.pi_clip_high": v})))):
            low, high = (h.ratio_low, h.ratio_high) if h.ratio_low == f32(1 - v) else (h.pi_ratio_low,
                                                                                        h.pi_ratio_high)
            assert np.asarray(low).dtype == np.float32 and low == f32(1 - v) and high == f32(1 + v), v


def test_the_authors_symmetric_pi_clip_bound_is_one_plus_eps_low():
    """`pipo.authors.pi_symmetric_clip` (DAPO under compat: 0.2 / 0.28) gives the token-ratio PI step the
    upper bound 1 + eps_low; GSPO's sequence-ratio PI step keeps 1 + eps_high, as the base loss does."""
    dapo = hyper.hyperparameters_of(spec_of(config("dapo", **{"pipo.compat": True})))
    assert dapo.ratio_high == np.float32(1 + 0.28) and dapo.pi_ratio_high == np.float32(1 + 0.2)
    assert dapo.pi_ratio_low == np.float32(1 - 0.2)
    plain = hyper.hyperparameters_of(spec_of(config("dapo")))
    assert plain.pi_ratio_high == np.float32(1 + 0.28)
    gspo = hyper.hyperparameters_of(spec_of(config("gspo", **{"pipo.compat": True})))
    assert gspo.pi_ratio_high == gspo.ratio_high == np.float32(1 + 4e-4)


def _per_token_clip_losses(ratio_low, ratio_high):
    """(the token clip's per-token loss [8, 64] with dual clip, CISPO's per-token gradient -w A / N [8, 64]) on
    fixed random inputs, many tokens clipped on either side; bounds: Python floats (constants of the
    program) or float32 arrays (traced)."""
    from pipo_jax.losses import policy
    from pipo_jax.losses.aggregation import Aggregation

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    logp_old = -jax.random.uniform(k1, (8, 64), minval=0.1, maxval=3.0)
    logp = logp_old + 0.3 * jax.random.normal(k2, (8, 64))
    adv = jax.random.normal(k3, (8, 64))
    mask = np.ones((8, 64), np.float32)
    agg = Aggregation("token-mean", num_tokens=float(mask.size))
    bounds = {} if isinstance(ratio_low, float) else {"lo": ratio_low, "hi": ratio_high}

    def run(lo=ratio_low, hi=ratio_high):
        token = policy.clipped_surrogate(policy.token_log_ratio(logp, logp_old), adv, ratio_low=lo, ratio_high=hi,
                                         clip_ratio_c=3.0)[0]
        cispo = jax.grad(lambda lp: policy.cispo_loss(lp, logp_old, adv, mask, agg=agg, ratio_low=lo,
                                                      ratio_high=hi)[0])(logp)
        return token, cispo

    return jax.jit(run)(**bounds)


def test_clipped_losses_with_hyper_equal_their_python_constant_form_bit_for_bit():
    """The per-token token-clip loss and CISPO's per-token gradient with the traced bounds of a config's
    `Hyperparameters` equal, bit for bit, the same with the bounds folded from Python floats (1.0 - eps_low,
    1.0 + eps_high: the program before hyperparameters were data); bounds computed in float32 from the
    float32 eps (0.18) give other values (the check can fail)."""
    for v in EPS:
        h = hyper.hyperparameters_of(spec_of(config(**{"loss.clip_low": v, "loss.clip_high": v})))
        got, want = _per_token_clip_losses(h.ratio_low, h.ratio_high), _per_token_clip_losses(1.0 - v, 1.0 + v)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=str(v))
    f32 = np.float32
    got = _per_token_clip_losses(jax.numpy.float32(1) - f32(0.18), jax.numpy.float32(1) + f32(0.18))
    want = _per_token_clip_losses(1.0 - 0.18, 1.0 + 0.18)
    assert not np.array_equal(got[0], want[0]) and not np.array_equal(got[1], want[1])
